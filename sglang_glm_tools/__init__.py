"""Tools around the sglang-glm plugin, kept out of the runtime package `sglang_glm`.

- `checkpoint`: writes HF-format GLM-DSA checkpoints (tiny random, FP8, dequantized twins) and
  trains their tokenizers; the tests' and benchmarks' fixtures.
- `reference`: the plain-PyTorch GLM-DSA + MTP model (the float64 oracle, the training model).
- `calibrate` + `calibration`: the IndexCache plan search (`sglang-glm-calibrate`).
- `carry_check`: serves a checkpoint with both MTP carries and recommends one; `carry_models`: the
  carry pair (one target, MTP layers trained with each carry) in the repository's `assets/`.
- `chat_format`: GLM-5's chat tokens and template; `chat_data`: the chat fine-tune's conversations.
- `server`: real SGLang HTTP servers for the tests, the CPU demo and the benchmarks (own process
  group, /health, retried start-ups); `serving_bench`: what the serving benchmarks share.

A GPU server imports none of this; the bundled trained model lives in the repository's `assets/`.
"""
