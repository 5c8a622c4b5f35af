"""Tests of mocheg_jax.data.text: tags, paragraphs, sentences, gold explanations, counts."""

from __future__ import annotations

import random

import pytest

from mocheg_jax.data import text


# ---- strip_tags ------------------------------------------------------------------------

@pytest.mark.parametrize("raw, want", [
    ("<p>Hello world.</p>", "Hello world."),
    ("<P CLASS='x'>Hi</P>", "Hi"),
    ("Hello <b>bold</b>ed <a href='http://x.org/a.b'>link</a>.", "Hello bolded link."),
    ("line<br>break<br/>again</div><div>next", "line break again next"),
    ("a &amp; b &lt;p&gt; &quot;q&quot; &#8220;c&#8221;", 'a & b <p> "q" “c”'),
    ("no&nbsp;break", "no break"),
    ("  many   spaces\n\tand\nnewlines  ", "many spaces and newlines"),
    ("x<!-- a comment <p> -->y", "x y"),
    ("<script>var a = '<p>';</script>Text<style>p {}</style>", "Text"),
    ("3 < 5 and 7 > 6", "3 < 5 and 7 > 6"),
    ("", ""),
])
def test_strip_tags(raw, want):
  assert text.strip_tags(raw) == want


# ---- paragraphs ------------------------------------------------------------------------

def test_paragraphs_split_on_p_tags_and_blank_lines():
  doc = ("<p>First one.</p><p class=\"lead\">  Second\n<b>one</b>. </p>\n\n<p></p><p> </p>"
         "Loose text\n\nafter a blank line\nwith a newline.<P>Upper</P><pre>kept</pre>")
  assert text.paragraphs(doc) == [
      "First one.", "Second one.", "Loose text", "after a blank line with a newline.",
      "Upper", "kept",
  ]


def test_paragraphs_of_empty_document():
  assert text.paragraphs("") == []
  assert text.paragraphs("<p></p>\n\n<p>  </p>") == []


# ---- split_sentences -------------------------------------------------------------------

SENTENCE_CASES = {
    "titles": (
        "Dr. Smith met Mr. Jones and Mrs. Brown. Ms. Lee, Prof. Xu, Gen. Patton, Sen. Warren, "
        "Rep. Lee and Gov. Newsom came too.",
        ["Dr. Smith met Mr. Jones and Mrs. Brown.",
         "Ms. Lee, Prof. Xu, Gen. Patton, Sen. Warren, Rep. Lee and Gov. Newsom came too."]),
    "saint": (
        "They flew to St. Louis on Monday. It rained.",
        ["They flew to St. Louis on Monday.", "It rained."]),
    "street_ends_sentence": (
        "He lives on Main St. Then he moved.",
        ["He lives on Main St.", "Then he moved."]),
    "suffixes_mid_sentence": (
        "Martin Luther King Jr. was born in Atlanta. John Smith Sr. said so.",
        ["Martin Luther King Jr. was born in Atlanta.", "John Smith Sr. said so."]),
    "companies_mid_sentence": (
        "Acme Inc. and Foo Ltd. merged with Bar Co. and Baz Corp. last year. Shares rose.",
        ["Acme Inc. and Foo Ltd. merged with Bar Co. and Baz Corp. last year.",
         "Shares rose."]),
    "company_ends_sentence": (
        "He works for Acme Inc. The firm is big.",
        ["He works for Acme Inc.", "The firm is big."]),
    "vs_and_etc": (
        "It was Smith vs. Jones in court. Apples, pears, etc. were sold. We bought milk, etc. "
        "Then we left.",
        ["It was Smith vs. Jones in court.", "Apples, pears, etc. were sold.",
         "We bought milk, etc.", "Then we left."]),
    "eg_ie": (
        "Some fruit, e.g. apples, are red, i.e. ripe. Bands, e.g. The Beatles, sold well.",
        ["Some fruit, e.g. apples, are red, i.e. ripe.",
         "Bands, e.g. The Beatles, sold well."]),
    "am_pm": (
        "We met at 9 a.m. and left at 5 p.m. on Friday. We left at 5 p.m. Police came later.",
        ["We met at 9 a.m. and left at 5 p.m. on Friday.", "We left at 5 p.m.",
         "Police came later."]),
    "number_abbreviations": (
        "He lives at No. 5 Baker Street. Vol. 3 and Fig. 2 show it on p. 7. It is small.",
        ["He lives at No. 5 Baker Street.", "Vol. 3 and Fig. 2 show it on p. 7.",
         "It is small."]),
    "months": (
        "It happened on Jan. 6, 2021. On Feb. 14 we met. He was born in Sept. 1990. "
        "It was in Oct. The rest is history.",
        ["It happened on Jan. 6, 2021.", "On Feb. 14 we met.", "He was born in Sept. 1990.",
         "It was in Oct.", "The rest is history."]),
    "acronyms_mid_sentence": (
        "The U.S. Army and the U.K. government met at the U.N. headquarters. Talks ended.",
        ["The U.S. Army and the U.K. government met at the U.N. headquarters.",
         "Talks ended."]),
    "acronym_ends_sentence": (
        "The rule applies in the U.S. The next step is Canada. He has a Ph.D. However, he "
        "left.",
        ["The rule applies in the U.S.", "The next step is Canada.", "He has a Ph.D.",
         "However, he left."]),
    "initials": (
        "J. R. Venn said the test failed. T. S. Eliot agreed. It was Plan B. The plan failed.",
        ["J. R. Venn said the test failed.", "T. S. Eliot agreed.", "It was Plan B.",
         "The plan failed."]),
    "decimals_and_money": (
        "The cost was 3.5 million dollars. It was $4.20 each, or $4.2 million in total. "
        "Growth was 0.5%. 12 people agreed.",
        ["The cost was 3.5 million dollars.", "It was $4.20 each, or $4.2 million in total.",
         "Growth was 0.5%.", "12 people agreed."]),
    "versions": (
        "Version 2.0.1 was released. Python 3.11 is next. It runs v1.2.3. Good.",
        ["Version 2.0.1 was released.", "Python 3.11 is next.", "It runs v1.2.3.", "Good."]),
    "urls_and_emails": (
        "See https://example.org/a.b?c=d for details. Write to john.doe@example.com. Thanks. "
        "Please see www.site.com. Then go.",
        ["See https://example.org/a.b?c=d for details.", "Write to john.doe@example.com.",
         "Thanks.", "Please see www.site.com.", "Then go."]),
    "ellipses": (
        "He paused... Then he left. Wait… What? And then... nothing happened.",
        ["He paused...", "Then he left.", "Wait…", "What?", "And then... nothing happened."]),
    "quotes": (
        'He said "no." Then he left. She said \u201cyes.\u201d Fine. He said \'maybe.\' OK. '
        '"Why?" she asked. He said "Stop." "Why?" she asked.',
        ['He said "no."', "Then he left.", "She said \u201cyes.\u201d", "Fine.",
         "He said 'maybe.'", "OK.", '"Why?" she asked.', 'He said "Stop."',
         '"Why?" she asked.']),
    "brackets": (
        "(See below.) Next we go. It failed (as expected). Then [it rained.] Done.",
        ["(See below.)", "Next we go.", "It failed (as expected).", "Then [it rained.]",
         "Done."]),
    "question_and_exclamation": (
        'Is it true? Yes! It is. Really?! No way. "Stop!" he shouted. Why? 42.',
        ["Is it true?", "Yes!", "It is.", "Really?!", "No way.", '"Stop!" he shouted.',
         "Why?", "42."]),
    "spaces_and_newlines": (
        "  One  sentence\nhere.   Two\tsentences\n here.  ",
        ["One sentence here.", "Two sentences here."]),
    "blank_line_is_a_boundary": (
        "First part without a stop\n\n  \nSecond part.",
        ["First part without a stop", "Second part."]),
    "no_final_punctuation": (
        "One. And a last one without",
        ["One.", "And a last one without"]),
    "single_sentence": ("No final punctuation here", ["No final punctuation here"]),
    "lowercase_next_word_never_splits": (
        "Mr. and Mrs. Smith came. It ended. iPhones sold.",
        ["Mr. and Mrs. Smith came.", "It ended. iPhones sold."]),
    "documented_limit_name_after_acronym": (
        "He lived in the U.S. Officials said so.",
        ["He lived in the U.S. Officials said so."]),
    "lowercase_letter_is_a_word": (
        "He bought a. The end.",
        ["He bought a.", "The end."]),
}


@pytest.mark.parametrize("case", sorted(SENTENCE_CASES))
def test_split_sentences(case):
  raw, want = SENTENCE_CASES[case]
  assert text.split_sentences(raw) == want


@pytest.mark.parametrize("raw", ["", "   ", "\n\n"])
def test_split_sentences_of_nothing(raw):
  assert text.split_sentences(raw) == []


def test_abbreviation_splits_only_before_sentence_starters():
  for starter in ("The", "It", "However,", "In", "According"):
    assert len(text.split_sentences(f"It was in the U.S. {starter} next one.")) == 2
  for name in ("Army", "Senate", "Officials", "Smith"):
    assert len(text.split_sentences(f"Dr. Jones met the U.S. {name} today.")) == 1


# ---- document_sentences ----------------------------------------------------------------

def test_document_sentences_paragraph_is_a_boundary():
  doc = ("<p>Dr. Smith spoke. It rained</p><p>He lives in the U.S.</p>"
         "<p>Officials said so. Yes.</p>\n\nLast paragraph")
  assert text.document_sentences(doc) == [
      "Dr. Smith spoke.", "It rained", "He lives in the U.S.", "Officials said so.", "Yes.",
      "Last paragraph",
  ]


_NAMES = ("Dr. Smith", "Mr. Jones", "Mrs. Lee", "St. Louis", "the U.S. Army", "the U.K.",
          "No. 5", "J. R. Venn", "Gov. Ames", "Sen. Ruiz")
_AMOUNTS = ("3.5 million", "$4.2 million", "$4.20", "0.75 percent", "version 2.1.3")
_LINKS = ("https://example.org/a.b?c=d", "www.site.com", "press@news.example.com")
_WORDS = ("the photo shows a crowd during a protest that was shared online by many users "
          "in the city last year while officials denied it").split()


def _generated_sentence(rng: random.Random) -> str:
  """A sentence in the style of the synthetic world's KB articles, with hard cases."""
  words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 14))]
  for pool in (_NAMES, _AMOUNTS, _LINKS):
    if rng.random() < 0.5:
      words.insert(rng.randrange(len(words) + 1), rng.choice(pool))
  sentence = " ".join(words)
  kind = rng.randrange(6)
  if kind == 0:
    sentence = f'{rng.choice(_NAMES)} said "{sentence[0].upper()}{sentence[1:]}."'
  elif kind == 1:
    sentence += "?"
  elif kind == 2:
    sentence += " in the U.S."  # Only followed by a sentence starter (see below).
  else:
    sentence += "."
  # Sentences open with a capital, as the splitter's rules require.
  return sentence[0].upper() + sentence[1:]


def test_document_sentences_reproduces_generated_articles():
  rng = random.Random(1234)
  for _ in range(300):
    paragraphs = []
    for _ in range(rng.randint(1, 5)):
      sentences = []
      for _ in range(rng.randint(1, 6)):
        sentence = _generated_sentence(rng)
        if sentences and sentences[-1].endswith("U.S."):
          sentence = rng.choice(["The", "It", "However,", "In"]) + " " + sentence
        sentences.append(sentence)
      paragraphs.append(sentences)
    document = "".join("<p>" + " ".join(p) + "</p>" for p in paragraphs)
    assert text.document_sentences(document) == [s for p in paragraphs for s in p], document


# ---- extract_gold_explanation ----------------------------------------------------------

def test_gold_explanation_inline_paragraph():
  article = ("<p>Claim text here.</p><p>Some analysis.</p>"
             "<p>Our ruling: The photo was edited. It is false.</p><p>Sources</p>")
  assert text.extract_gold_explanation(article) == (
      "Our ruling: The photo was edited. It is false.")


def test_gold_explanation_in_sum_after_tags_and_spaces():
  article = "<p>Intro.</p><p>  <b>In sum</b>, the quote is fake.</p><p>More.</p>"
  assert text.extract_gold_explanation(article) == "In sum, the quote is fake."
  assert text.extract_gold_explanation("Intro.\n\nIN SUMMARY, no.\n\nEnd.") == "IN SUMMARY, no."


def test_gold_explanation_heading_then_paragraphs():
  article = ("<p>Intro.</p><p><strong>Our Ruling:</strong></p><p>The image is old.</p>"
             "<p>It was taken in 2010, not 2020.</p><p>Sources</p><p>Smith, J. 2010.</p>")
  assert text.extract_gold_explanation(article) == (
      "The image is old. It was taken in 2010, not 2020.")


def test_gold_explanation_heading_runs_to_the_end():
  article = "Intro.\n\nOur ruling\n\nFirst part.\n\nSecond part."
  assert text.extract_gold_explanation(article) == "First part. Second part."


@pytest.mark.parametrize("article", [
    "",
    "<p>Nothing to see.</p><p>Our rulings are fair.</p>",
    "<p>In Sumatra, it rained.</p>",
    "<p>Intro.</p><p>Our ruling:</p>",
    "<p>Intro.</p><p>Our ruling</p><p>Sources</p><p>x.</p>",
])
def test_gold_explanation_absent(article):
  assert text.extract_gold_explanation(article) == ""


def test_gold_explanation_takes_the_first_match():
  article = "<p>In sum, first.</p><p>Our ruling: second.</p>"
  assert text.extract_gold_explanation(article) == "In sum, first."


# ---- word_count ------------------------------------------------------------------------

@pytest.mark.parametrize("raw, want", [
    ("", 0),
    ("   ", 0),
    ("one", 1),
    ("<p>Hello  world</p>", 2),
    ("a &amp; b", 3),
    ("Dr. Smith's   claim\nis <b>false</b>.", 5),
    ("tags<br>split<p>words", 3),
])
def test_word_count(raw, want):
  assert text.word_count(raw) == want
