"""The IndexCache layer plan: transformers 5.19 agreement, override precedence, clear errors."""

import json

import pytest
from transformers import GlmMoeDsaConfig

from sglang_glm.layer_plan import LayerPlan, LayerPlanError, resolve_layer_plan

GLM52_FULL = [0, 1, 2] + list(range(6, 78, 4))  # facts note: 21 full layers of 78


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"index_topk_freq": 4},
        {"index_topk_freq": 4, "index_skip_topk_offset": 3},
        {"index_topk_freq": 3, "index_skip_topk_offset": 1},
        {"index_topk_freq": 2, "index_skip_topk_offset": 5},
        {"index_topk_pattern": "FFSFSSFS"},
        {"indexer_types": ["full", "shared", "full", "full", "shared", "shared", "shared", "full"]},
    ],
)
def test_agrees_with_transformers(fields):
    config = GlmMoeDsaConfig(num_hidden_layers=8, **fields)
    assert list(resolve_layer_plan(config).kinds) == config.indexer_types
    # The raw config.json dict of a checkpoint resolves the same way.
    assert resolve_layer_plan({"num_hidden_layers": 8, **fields}).kinds == tuple(config.indexer_types)


def test_glm52_config():
    fields = {
        "num_hidden_layers": 78,
        "index_topk_freq": 4,
        "index_skip_topk_offset": 3,
        "index_topk_pattern": None,
        "indexer_types": ["full" if i in GLM52_FULL else "shared" for i in range(78)],
    }
    plan = resolve_layer_plan(fields)
    assert plan.full_layers == tuple(GLM52_FULL)
    assert plan.source_layer(5) == 2 and plan.source_layer(6) == 6 and plan.source_layer(77) == 74
    assert "21 full, 57 shared of 78 layers" in plan.describe()


def test_override_replaces_checkpoint_plan_whatever_its_field():
    ckpt = {"num_hidden_layers": 4, "indexer_types": ["full", "full", "shared", "full"]}
    # SGLang has already merged the override into the config when the model reads it.
    merged = {**ckpt, "index_topk_pattern": "FSSS"}
    plan = resolve_layer_plan(merged, json.dumps({"index_topk_pattern": "FSSS"}))
    assert plan.pattern == "FSSS" and plan.source == "override index_topk_pattern"
    plan = resolve_layer_plan(ckpt, {"indexer_types": ["full"] * 4})
    assert plan.pattern == "FFFF"
    plan = resolve_layer_plan(ckpt, {"index_topk_freq": 2})
    assert plan.pattern == "FFSF"
    # An override naming no plan field leaves the checkpoint's plan in force.
    assert resolve_layer_plan(ckpt, {"index_topk": 64}).pattern == "FFSF"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"index_topk_pattern": "SFFF"}, "layer 0 is 'shared'"),
        ({"indexer_types": ["shared", "full", "full", "full"]}, "layer 0 is 'shared'"),
        ({"index_topk_pattern": "FFF"}, "has 3 entries but the model has num_hidden_layers = 4"),
        ({"index_topk_pattern": "FFxF"}, "contains 'x'; use only 'F'"),
        ({"indexer_types": ["full", "dense", "full", "full"]}, "layer 1 is 'dense'"),
        ({"index_topk_freq": 0}, "index_topk_freq = 0; it must be an integer >= 1"),
        ({"index_topk_freq": True}, "index_topk_freq = True; it must be an integer >= 1"),
        ({"index_topk_freq": 2, "index_skip_topk_offset": "2"}, "index_skip_topk_offset = '2'; it must be an integer >= 1"),
        ({"index_topk_freq": 2, "index_skip_topk_offset": 1.5}, "index_skip_topk_offset = 1.5; it must be"),
        ({"indexer_types": "[full, shared]"}, "indexer_types = '[full, shared]' is not a JSON list; use a list"),
        ({"indexer_types": "full,shared"}, "is not a JSON list"),
        ({"indexer_types": 5}, "indexer_types = 5; use a list with one entry per layer"),
        ({"index_topk_pattern": 1234}, "index_topk_pattern = 1234; use a string of F (full) and S (shared)"),
        (
            {"index_topk_pattern": "FFSF", "indexer_types": ["full"] * 4},
            "indexer_types (FFFF) and override index_topk_pattern (FFSF) disagree",
        ),
    ],
)
def test_bad_plans_name_field_value_and_fix(fields, message):
    with pytest.raises(LayerPlanError) as err:
        resolve_layer_plan({"num_hidden_layers": 4}, fields)
    assert message in str(err.value)


def test_checkpoint_fields_that_disagree():
    config = {"num_hidden_layers": 4, "index_topk_pattern": "FFSF", "index_topk_freq": 1}
    with pytest.raises(LayerPlanError, match="checkpoint index_topk_pattern .* disagree"):
        resolve_layer_plan(config)


def test_plan_object():
    plan = LayerPlan.from_pattern("FSSFS")
    assert plan.full_layers == (0, 3)
    assert [plan.source_layer(i) for i in range(5)] == [0, 0, 0, 3, 3]
    assert LayerPlan.all_full(3).pattern == "FFF"


def test_settings_resolve_plan_mtp_and_indexer_once():
    """GlmDsaSettings: one frozen object from the config, the launch override and the backends."""
    import dataclasses

    from sglang_glm.settings import GLM_INDEXER, SGLANG_INDEXER, GlmDsaSettings, module_config

    cfg = GlmMoeDsaConfig(num_hidden_layers=4, index_topk=16, index_topk_pattern="FFSF",
                          index_share_for_mtp_iteration=True)
    settings = GlmDsaSettings.from_config(
        cfg, json.dumps({"mtp_recycle_hidden": "pre_norm"}), ("glm_dsa_torch", "glm_dsa_torch")
    )
    assert settings.plan.pattern == "FFSF" and settings.recycle == "pre_norm"
    assert settings.index_share and settings.index_topk == 16 and settings.indexer == GLM_INDEXER
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.index_topk = 8
    assert GlmDsaSettings.from_config(cfg, None, ("dsa", "dsa")).indexer == SGLANG_INDEXER
    assert GlmDsaSettings.from_config(cfg, {"index_topk_pattern": "FSSS"}).plan.pattern == "FSSS"
    # The modules' config fills MoE routing defaults on a copy; SGLang's config stays as loaded.
    cfg.topk_method = None
    built = module_config(cfg)
    assert built.topk_method == "noaux_tc" and built.scoring_func == "sigmoid"
    assert cfg.topk_method is None


@pytest.mark.parametrize("override, message", [
    ({"index_topk_patern": "FFFF"}, "key 'index_topk_patern' is not a GLM-DSA field the plugin reads; did you mean 'index_topk_pattern'?"),
    ({"mtp_recycle_hiden": "pre_norm"}, "did you mean 'mtp_recycle_hidden'?"),
    ({"index_share_for_mtp_iteration": "false"}, "index_share_for_mtp_iteration = 'false'; use true"),
    ({"index_topk": 0}, "index_topk = 0; use a positive integer"),
    ({"index_topk": "2048"}, "index_topk = '2048'; use a positive integer"),
    ({"index_topk": 2048.0}, "index_topk = 2048.0; use a positive integer"),
])
def test_bad_settings_name_field_value_and_fix(override, message):
    from sglang_glm.settings import GlmDsaSettings

    cfg = GlmMoeDsaConfig(num_hidden_layers=4, index_topk=16, index_topk_pattern="FFSF")
    with pytest.raises(ValueError) as err:
        GlmDsaSettings.from_config(cfg, override)
    assert message in str(err.value)
    # other config fields pass untouched, typos or not, when no plugin field is near them
    assert GlmDsaSettings.from_config(cfg, {"rope_theta": 1e6, "index_head_dim": 128}).index_topk == 16
