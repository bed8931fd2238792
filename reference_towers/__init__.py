"""Faithful, small re-implementations of vision towers and their host models.

Plain PyTorch (no vLLM), so that generated encoder CUDA graph mixins can run
on a GPU against a known-good eager result:

* :mod:`reference_towers.deepseek_v4`: DeepSeek-V4.1 (ViT + aligner, image
  spans with learned delimiters);
* :mod:`reference_towers.internvl`: InternVL (InternViT over fixed 448² tiles,
  pixel shuffle, ``mlp1``);
* :mod:`reference_towers.kimi_vl`: Kimi-VL (MoonViT with interpolated
  position embeddings and complex 2-D RoPE, gather merger, projector);
* :mod:`reference_towers.minimax_vl`: MiniMax M3 (ViT with partial 3-D RoPE,
  projector, patch merger);
* :mod:`reference_towers.qwen2_vl`: Qwen2-VL (ViT with 2-D RoPE, per-frame
  attention, patch merger);
* :mod:`reference_towers.qwen2_5_vl`: Qwen2.5-VL (windowed and full
  attention blocks, window order, gated MLP, RMSNorm);
* :mod:`reference_towers.step3_vl`: Step3-VL (one ViT for a global view and
  504² crops, two stride convolutions, projector; two encoder paths);
* :mod:`reference_towers.registry`: ``REFERENCE_TOWERS``, the per-spec hook a
  test suite uses to build hosts, draw items, make inputs and get the ground
  truth.
"""
