"""Text clean-up, paragraphs, sentences and gold explanations of Mocheg articles.

Pure Python and `re`; no downloaded data (nltk's punkt model is not available here).

The sentence splitter is rule based. A candidate boundary is a terminator (`.`, `!`, `?`, an
ellipsis `...`/`…`, or a run such as `?!`), optionally followed by closing quotes or
brackets, followed by whitespace. Whether a candidate is a boundary depends on the next word
(after any opening quotes or brackets) and, for a single `.`, on the token it ends:

* A next word that starts with a lower-case letter, or with `, ; : . ) ] } %`, never starts
  a sentence ("Mr. and Mrs.", "e.g. the", "etc. and", ". . .").
* `!`, `?` and ellipses split before anything else (an upper-case letter, a digit, a quote).
* A `.` after an ordinary token splits too. Ordinary tokens include numbers ("$4.20."),
  URLs and e-mail addresses ("www.site.com."), and the abbreviations that usually end
  sentences (`ENDING_ABBREVIATIONS`: "etc.", "Inc.", "Ltd.", "Co.", "Corp.", "Jr.", "Sr.",
  "a.m.", "p.m.").
* A `.` after an abbreviation that usually continues (`ABBREVIATIONS`: titles such as "Dr.",
  "Mr.", "St.", "Sen.", "Gov."; "No.", "Vol.", "Fig.", "p."; the months "Jan." ... "Dec."),
  after an upper-case single-letter initial ("J."), or after a dotted acronym ("U.S.",
  "U.K.", "Ph.D.") splits only when the next word is one of `SENTENCE_STARTERS`:
  closed-class words that open sentences (articles, pronouns, prepositions, conjunctions,
  sentence adverbs such as "The", "It", "In", "However", "According"), never names. So
  "in the U.S. The next" and "on Main St. Then" split, while "Dr. Smith", "St. Louis",
  "U.S. Army", "No. 5", "Jan. 6" and "J. R. Venn" do not.
* `INNER_ABBREVIATIONS` ("e.g.", "i.e.", "vs.", "v.", "cf.", "viz.") never end a sentence.

Limits of the heuristic (by design, to stay fast and predictable): a sentence that ends
with a continuing abbreviation, an initial or an acronym and is followed by a capitalised
word that is not a sentence starter ("...in the U.S. Officials said") is not split; a
sentence that starts with a lower-case word ("...ended. iPhones sold") is joined to the
previous one; a terminator with no following space ("ended.Then") is not a boundary; an
abbreviation missing from our lists splits before any capitalised word ("Dept. Head");
a lower-case single letter is an ordinary word ("bought a. The"). Text generated for tests
must follow these rules: end a sentence with an abbreviation only when the next sentence
opens with a `SENTENCE_STARTERS` word.
"""

from __future__ import annotations

import html
import re

# Abbreviations (without the final ".") that usually continue the sentence: titles before a
# name, number and reference abbreviations before a number, and month abbreviations before
# a day. After them a sentence only starts with one of SENTENCE_STARTERS.
TITLE_ABBREVIATIONS: frozenset[str] = frozenset((
    "Dr", "Mr", "Mrs", "Ms", "Mx", "Messrs", "Mmes", "Mme", "Mlle", "Prof", "St", "Ste",
    "Mt", "Ft", "Gen", "Sen", "Sens", "Rep", "Reps", "Gov", "Govs", "Pres", "Lt", "Col",
    "Capt", "Cpt", "Cmdr", "Adm", "Maj", "Sgt", "Cpl", "Pvt", "Rev", "Hon", "Fr", "Msgr",
    "Supt", "Insp", "Det", "Atty", "Gens", "Brig", "Ave", "Blvd", "Rd", "Hwy",
))
NUMBER_ABBREVIATIONS: frozenset[str] = frozenset((
    "No", "Nos", "no", "nos", "Vol", "vol", "Vols", "vols", "Fig", "fig", "Figs", "figs",
    "Art", "art", "Ch", "ch", "Sec", "sec", "Pt", "pt", "Pp", "pp", "Ex", "Eq", "eq", "Op",
    "op", "Ref", "ref", "Tel", "tel", "approx", "Approx", "ca", "c", "est", "Est", "p",
))
MONTH_ABBREVIATIONS: frozenset[str] = frozenset((
    "Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec",
))
ABBREVIATIONS: frozenset[str] = TITLE_ABBREVIATIONS | NUMBER_ABBREVIATIONS | MONTH_ABBREVIATIONS
# Never end a sentence, whatever follows.
INNER_ABBREVIATIONS: frozenset[str] = frozenset((
    "e.g", "i.e", "E.g", "I.e", "vs", "Vs", "v", "cf", "Cf", "viz", "al",  # "et al." cites.
))
# Usually end a sentence when a capitalised word follows: treated as ordinary words.
ENDING_ABBREVIATIONS: frozenset[str] = frozenset((
    "etc", "Inc", "Ltd", "Co", "Corp", "Jr", "Sr", "Bros", "Esq", "a.m", "p.m", "A.M", "P.M",
    "LLC", "PLC",
))
# Closed-class words that open sentences and are not names: after an abbreviation, an initial
# or an acronym, only these start a new sentence.
SENTENCE_STARTERS: frozenset[str] = frozenset((
    "A", "An", "The", "This", "That", "These", "Those", "It", "Its", "It's", "He", "She",
    "They", "We", "I", "You", "His", "Her", "Their", "Our", "My", "Your", "There", "Here",
    "In", "On", "At", "By", "For", "From", "With", "Without", "Of", "To", "Into", "As",
    "After", "Before", "During", "Since", "Until", "Over", "Under", "About", "Among",
    "Between", "Through", "When", "While", "Where", "Why", "How", "What", "Who", "Whom",
    "Whose", "Which", "If", "Although", "Though", "Because", "Unless", "Whether", "But",
    "And", "Or", "Nor", "Yet", "So", "However", "Moreover", "Meanwhile", "Furthermore",
    "Nevertheless", "Nonetheless", "Otherwise", "Also", "Still", "Then", "Thus",
    "Therefore", "Hence", "Instead", "Later", "Earlier", "Today", "Yesterday", "Tomorrow",
    "Now", "According", "Some", "Many", "Most", "All", "Both", "Each", "Every", "Several",
    "Few", "Not", "Such", "Other", "Another", "Neither", "Either", "Only", "Even", "Just",
    "Indeed", "Finally", "Similarly", "Additionally", "Despite", "Unlike", "Following",
    "Once", "Again", "Nobody", "Nothing", "Everyone", "Someone", "None", "Let", "Do",
    "Does", "Did", "Is", "Are", "Was", "Were", "Has", "Have", "Had", "Can", "Could", "Would",
    "Should", "Must", "Whatever", "Whoever", "Overall", "Ultimately",
))

_OPENERS = "\"'“‘«([{¿¡*"
_CLOSERS = "\"'”’»)]}"
# Characters that cannot open a sentence even though they are not lower-case letters.
_CONTINUATION = frozenset(",;:.)]}%")

# A terminator run, then closing quotes/brackets, then the one space that separates it from
# the next sentence (whitespace is collapsed to single spaces before matching).
_CANDIDATE = re.compile(r"(?:[.!?…]+)[\"'”’»)\]}]* ")
_ACRONYM = re.compile(r"(?:[A-Za-z]{1,2}\.)+[A-Za-z]{1,2}")
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n\s*")
_PARAGRAPH_BREAK = re.compile(r"</?p\b[^>]*>|\n[^\S\n]*\n", re.IGNORECASE)
# Tags whose content is not text at all.
_NON_TEXT = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
# Inline tags vanish without a space ("<b>bold</b>ed" -> "bolded"); any other tag or comment
# is a word break.
_INLINE_TAG = re.compile(
    r"</?(?:a|b|i|u|s|em|strong|span|small|big|sup|sub|font|abbr|code|mark|q|cite|ins|del|tt)"
    r"\b[^<>]*>", re.IGNORECASE)
_ANY_TAG = re.compile(r"<!--.*?-->|<![A-Za-z][^<>]*>|</?[A-Za-z][^<>]*>", re.DOTALL)
_RULING_START = re.compile(r"(?:our\s+ruling|in\s+sum(?:mary)?)\b", re.IGNORECASE)
_HEADING_REST = re.compile(r"[\s:.\-–—]*")
_MAX_HEADING_WORDS = 8


def strip_tags(text: str) -> str:
  """Removes HTML tags (`<p>`, `</p>` and any other), unescapes entities, collapses spaces."""
  if "<" in text:
    if "<s" in text or "<S" in text:
      text = _NON_TEXT.sub(" ", text)
    text = _INLINE_TAG.sub("", text)
    text = _ANY_TAG.sub(" ", text)
  if "&" in text:
    text = html.unescape(text)
  # str.split() also splits on the no-break space that "&nbsp;" becomes.
  return " ".join(text.split())


def paragraphs(document: str) -> list[str]:
  """The non-empty paragraphs of a KB `Origin Document`, tags removed.

  Paragraphs are separated by `<p>` / `</p>` tags (with or without attributes) and by blank
  lines; a single newline is only a space.
  """
  parts = (strip_tags(part) for part in _PARAGRAPH_BREAK.split(document))
  return [part for part in parts if part]


def split_sentences(text: str) -> list[str]:
  """Splits text into sentences with the rules in the module docstring.

  Whitespace inside each sentence is collapsed to single spaces; a blank line is always a
  sentence boundary; the last sentence needs no final punctuation.
  """
  if "\n" in text and _BLANK_LINE.search(text):
    return [s for block in _BLANK_LINE.split(text) for s in _split_clean(" ".join(block.split()))]
  return _split_clean(" ".join(text.split()))


def document_sentences(document: str) -> list[str]:
  """The sentences of an article: `paragraphs()`, then `split_sentences()` per paragraph.

  A paragraph boundary is always a sentence boundary. Sentence `i` of this list is the row
  with `paragraph_id = i` of the sentence-level KB.
  """
  return [s for paragraph in paragraphs(document) for s in _split_clean(paragraph)]


def _next_word(text: str, pos: int) -> str:
  """The word at `pos` without opening quotes/brackets or a trailing `,;:`."""
  end = text.find(" ", pos)
  word = text[pos:] if end < 0 else text[pos:end]
  return word.lstrip(_OPENERS).rstrip(",;:")


def _is_boundary(text: str, match: re.Match[str]) -> bool:
  """Whether the candidate `match` ends a sentence (see the module docstring)."""
  pos = match.end()
  first = text[pos]
  while first in _OPENERS:  # The next word starts after its opening quotes and brackets.
    pos += 1
    if pos == len(text):
      return True
    first = text[pos]
  if first.islower() or first in _CONTINUATION:
    return False
  terminator_end = match.start() + 1
  if text[match.start()] != "." or text[terminator_end] in ".!?…":
    return True  # "!", "?", an ellipsis or a mixed run such as ".?".
  # A single ".": look at the token it ends.
  token_start = text.rfind(" ", 0, match.start()) + 1
  core = text[token_start:match.start()].lstrip(_OPENERS)
  if core in ABBREVIATIONS:
    return _next_word(text, pos) in SENTENCE_STARTERS
  if core in INNER_ABBREVIATIONS:
    return False
  if core in ENDING_ABBREVIATIONS:
    return True
  if len(core) == 1:
    # An upper-case initial ("J. R. Venn") continues unless a sentence starter follows; a
    # lower-case letter ("...bought a.") is an ordinary word.
    return not core.isupper() or _next_word(text, pos) in SENTENCE_STARTERS
  if "." in core and _ACRONYM.fullmatch(core):
    return _next_word(text, pos) in SENTENCE_STARTERS
  return True


def _split_clean(text: str) -> list[str]:
  """Splits text whose whitespace is already collapsed to single spaces and stripped."""
  sentences = []
  start = 0
  for match in _CANDIDATE.finditer(text):
    if _is_boundary(text, match):
      sentences.append(text[start:match.end() - 1])
      start = match.end()
  if start < len(text):
    sentences.append(text[start:])
  return sentences


def _is_heading(paragraph: str) -> bool:
  """A short paragraph without final punctuation: "Sources", "Related", "Our ruling"."""
  return (len(paragraph.split()) <= _MAX_HEADING_WORDS
          and paragraph.rstrip(_CLOSERS)[-1:] not in (".", "!", "?", "…"))


def extract_gold_explanation(ruling_article: str) -> str:
  """The gold explanation of a ruling article (`Origin`): its "Our ruling"/"In sum" paragraph.

  Rule: the first paragraph whose text (tags removed) starts with "Our ruling", "In sum" or
  "In summary" (case-insensitive, as a whole word) is the explanation, returned whole (its
  opening words included). When that paragraph is only a heading (nothing but ":", "." or
  dashes follows the opening words, e.g. "<p><b>Our Ruling:</b></p>"), the explanation is
  the paragraphs after it, joined by single spaces, up to the next heading-like paragraph
  (at most 8 words and no final `.`, `!`, `?`) or the end of the article.

  Returns:
    The explanation, or '' when the article has no such paragraph (or the heading is
    followed by no text).
  """
  parts = paragraphs(ruling_article)
  for i, paragraph in enumerate(parts):
    match = _RULING_START.match(paragraph)
    if match is None:
      continue
    if _HEADING_REST.fullmatch(paragraph, match.end()) is None:
      return paragraph
    body = []
    for following in parts[i + 1:]:
      if _is_heading(following):
        break
      body.append(following)
    return " ".join(body)
  return ""


def word_count(text: str) -> int:
  """Whitespace token count after `strip_tags` (for "mean / max claim tokens" statistics)."""
  if "<" in text or "&" in text:
    text = strip_tags(text)
  return len(text.split())
