"""Faithful, small re-implementations of vision towers and their host models.

Plain PyTorch (no vLLM), so that generated encoder CUDA graph mixins can run
on a GPU against a known-good eager result:

* :mod:`reference_towers.deepseek_v4`: DeepSeek-V4.1 (ViT + aligner, image
  spans with learned delimiters);
* :mod:`reference_towers.minimax_vl`: MiniMax M3 (ViT with partial 3-D RoPE,
  projector, patch merger);
* :mod:`reference_towers.internvl`: InternVL (InternViT over fixed 448² tiles,
  pixel shuffle, ``mlp1``);
* :mod:`reference_towers.step3_vl`: Step3-VL (one ViT for a global view and
  504² crops, two stride convolutions, projector; two encoder paths);
* :mod:`reference_towers.registry`: ``REFERENCE_TOWERS``, the per-spec hook a
  test suite uses to build hosts, draw items, make inputs and get the ground
  truth.
"""
