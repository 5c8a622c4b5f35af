"""The reference's verification module (VT-NLP/Mocheg BertMultiwayMatch2) restated in
PyTorch, for the benchmark (benchmarks/bench_verify.py) and the parity tests
(tests/test_verification_model.py): `TorchStance.forward` runs one claim as the reference
does, `TorchStance.batched` a masked batch; `to_torch` copies our StanceDetector's weights.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

# ---- the PyTorch module ---------------------------------------------------------------------
class TorchStance(torch.nn.Module):
  """The reference's BertMultiwayMatch2 in PyTorch, per claim (`forward`) and batched.

  Parameter names follow the reference (verification/util/stance_detect.py): two one-head
  (or `heads`) nn.MultiheadAttention(text_dim) with kdim = vdim = text_dim / image_dim,
  `linear_fuse_p` shared by both modalities, `classifier` (both stances) and
  `classifier_text` (one stance). See mocheg_jax/verification/stance.py for the semantics.
  """

  def __init__(self, cfg):
    super().__init__()
    dt, dv, hidden = cfg.text_dim, cfg.image_dim, cfg.hidden
    self.use_text, self.use_image, self.hidden = cfg.use_text, cfg.use_image, hidden
    self.linear_fuse_p = torch.nn.Linear(2 * dt, hidden)
    self.classifier = torch.nn.Linear(2 * hidden, cfg.num_classes)
    self.classifier_text = torch.nn.Linear(hidden, cfg.num_classes)
    self.txt_multihead_attn = torch.nn.MultiheadAttention(dt, cfg.heads, kdim=dt, vdim=dt,
                                                          batch_first=True)
    self.img_multihead_attn = torch.nn.MultiheadAttention(dt, cfg.heads, kdim=dv, vdim=dv,
                                                          batch_first=True)

  # -- one claim, as the reference runs it (claim [1, L, Dt]; items [n, L, D]) --
  def gen_stance(self, attn, claim, evidence, claim_mask, evidence_mask):
    claim_rep = claim.repeat(evidence.shape[0], 1, 1)
    m, _ = attn(claim_rep, evidence, evidence, key_padding_mask=~evidence_mask.bool())
    h = F.leaky_relu(self.linear_fuse_p(torch.cat([m - claim_rep, m * claim_rep], 2)))
    h = h.masked_fill(~claim_mask.bool().unsqueeze(-1), -10000)
    return torch.mean(torch.max(h, 1).values, 0, True)  # [1, hidden]

  def stances(self, claim, claim_mask, text, text_mask, image):
    out = []
    if self.use_text:
      out.append(self.gen_stance(self.txt_multihead_attn, claim, text, claim_mask, text_mask))
    if self.use_image and image is not None:  # has_image
      ones = torch.ones(image.shape[:2])
      out.append(self.gen_stance(self.img_multihead_attn, claim, image, claim_mask, ones))
    return out

  def forward(self, claim, claim_mask, text, text_mask, image):
    stance = torch.cat(self.stances(claim, claim_mask, text, text_mask, image), -1)
    if stance.shape[-1] == self.hidden:
      return self.classifier_text(stance)
    return self.classifier(stance)

  # -- batched with masks: claim [B, Lc, Dt], items [B, N, L, D], presence [B, N] --
  def _batched_stance(self, attn, claim, claim_mask, evidence, key_mask, present):
    b, n, length, e = evidence.shape
    lc, dt = claim.shape[1:]
    query = claim.unsqueeze(1).expand(b, n, lc, dt).reshape(b * n, lc, dt)
    # Absent items attend to all their (padding) keys, so no row is fully masked (NaN).
    keys = (key_mask | ~present.unsqueeze(-1)).reshape(b * n, length)
    evidence = evidence.reshape(b * n, length, e)
    m, _ = attn(query, evidence, evidence, key_padding_mask=~keys, need_weights=False)
    h = F.leaky_relu(self.linear_fuse_p(torch.cat([m - query, m * query], -1)))
    h = h.reshape(b, n, lc, -1).masked_fill(~claim_mask[:, None, :, None], -10000)
    h = h.max(2).values * present.unsqueeze(-1)  # [B, N, hidden]
    count = present.sum(-1)
    return h.sum(1) / count.clamp(min=1).unsqueeze(-1), count > 0

  def batched(self, claim, claim_mask, text=None, text_mask=None, image=None,
              image_mask=None):
    """Logits [B, C]; masks are bool; image_mask [B, Ni] is item presence (all patches)."""
    stances, presents = [], []
    if self.use_text:
      s, p = self._batched_stance(self.txt_multihead_attn, claim, claim_mask, text, text_mask,
                                  text_mask.any(-1))
      stances.append(s)
      presents.append(p)
    if self.use_image:
      keys = torch.ones(image.shape[:3], dtype=torch.bool)
      s, p = self._batched_stance(self.img_multihead_attn, claim, claim_mask, image, keys,
                                  image_mask)
      stances.append(s)
      presents.append(p)
    if len(stances) == 1:
      return self.classifier_text(stances[0])
    (s_text, s_image), (p_text, p_image) = stances, presents
    both = self.classifier(torch.cat(stances, -1))
    single = self.classifier_text(torch.where(p_text.unsqueeze(-1), s_text, s_image))
    return torch.where((p_text & p_image).unsqueeze(-1), both, single)


def _t(x) -> torch.Tensor:
  return torch.from_numpy(np.array(x, np.float32))


def _copy_attention(ours, mha: torch.nn.MultiheadAttention, packed: bool) -> None:
  def w(dense):  # [in, H, D] -> torch [H*D, in]
    k = np.asarray(dense.kernel[...])
    return _t(k.reshape(k.shape[0], -1).T)

  def b(dense):
    return _t(np.asarray(dense.bias[...]).reshape(-1))

  with torch.no_grad():
    if packed:
      mha.in_proj_weight.copy_(torch.cat([w(ours.query), w(ours.key), w(ours.value)], 0))
    else:
      mha.q_proj_weight.copy_(w(ours.query))
      mha.k_proj_weight.copy_(w(ours.key))
      mha.v_proj_weight.copy_(w(ours.value))
    mha.in_proj_bias.copy_(torch.cat([b(ours.query), b(ours.key), b(ours.value)]))
    out = np.asarray(ours.out.kernel[...])  # [H, D, E]
    mha.out_proj.weight.copy_(_t(out.reshape(-1, out.shape[-1]).T))
    mha.out_proj.bias.copy_(_t(ours.out.bias[...]))


def _copy_dense(ours, linear: torch.nn.Linear) -> None:
  with torch.no_grad():
    linear.weight.copy_(_t(np.asarray(ours.kernel[...]).T))
    linear.bias.copy_(_t(ours.bias[...]))


def to_torch(model) -> TorchStance:
  """A `TorchStance` (eval mode) holding a `StanceDetector`'s weights."""
  cfg = model.config
  ref = TorchStance(cfg).eval()
  if cfg.use_text:
    _copy_attention(model.text_attention, ref.txt_multihead_attn, packed=True)
  if cfg.use_image:
    _copy_attention(model.image_attention, ref.img_multihead_attn, packed=False)
  _copy_dense(model.fuse, ref.linear_fuse_p)
  if cfg.num_modalities == 2:
    _copy_dense(model.classifier, ref.classifier)
    if model.classifier_single is not None:
      _copy_dense(model.classifier_single, ref.classifier_text)
  else:
    _copy_dense(model.classifier, ref.classifier_text)
  return ref
