"""IndexCache calibration: choose which layers keep their indexer for a checkpoint.

One job per module:
- `inputs`:  what the checkpoint offers (layers with indexer weights) and the calibration text,
             cut into token sequences; every user error is raised here, before SGLang starts.
- `runner`:  the plugin's own GLM-DSA modules inside SGLang's in-process `ModelRunner` (no server),
             run with a layer plan per forward, caching what a candidate plan does not change.
- `search`:  the greedy search (share the layer whose sharing raises loss least), its resumable log.
- `overlap`: cross-layer top-k overlap (Jaccard of selected key positions) for every layer pair.
- `report`:  result JSON / markdown, the loss-vs-full-layers plot and the Jaccard heatmap.

The command is `sglang-glm-calibrate` (or `python -m sglang_glm_tools.calibrate`). `inputs`,
`search` and `report` import no SGLang; `runner` and `overlap` need SGLang (real SGLang 0.5.23;
on CPU through `sglang_glm.cpu_compat`).
"""


class CalibrationError(ValueError):
    """A calibration input that cannot be used; the message names the value and the fix."""
