"""The plugin is invisible to models that are not GLM-DSA.

A tiny Llama (MHA) and a tiny DeepSeek-V3 (MLA + MoE, with its MTP layer), random weights saved by
transformers, are served by real SGLang on CPU twice: with the plugin installed, and with it
filtered out by SGLang's own plugin allow-list (SGLANG_PLUGINS names only a plugin that does not
exist, so the plugin's `sglang.srt.plugins` entry point does not load). Both runs use the same CPU
launcher (the `sgl_kernel` stand-in is not part of the plugin).
The same greedy requests must give the same tokens and the same `meta_info` keys. (EAGLE for these
models does not run on CPU here either way: SGLang's draft-backend map lacks torch_native, their CPU
backend without the sgl-kernel CPU build.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import requests
import torch

from serving import http_server

pytestmark = pytest.mark.slow

TOKENIZER = Path(__file__).resolve().parent.parent / "assets" / "glm-dsa-mini"
VOCAB = 2048  # the bundled tokenizer's
PROMPTS = [[(13 * i + 7 * k) % 2000 + 5 for k in range(9 + 5 * i)] for i in range(3)]
NEW_TOKENS = 8
PLUGIN_OFF = {"SGLANG_PLUGINS": "no_such_plugin"}


def _save(model, path: Path) -> Path:
    model.float().save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, path / name)
    return path


def tiny_llama(path: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, bos_token_id=0, eos_token_id=0)
    return _save(LlamaForCausalLM(config), path)


def tiny_deepseek_v3(path: Path) -> Path:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(1)
    # kv_lora_rank == qk_nope_head_dim: without the sgl-kernel CPU build, SGLang 0.5.23 serves
    # DeepSeek attention on CPU with torch_native, whose prefill reads the latent KV cache where it
    # expects keys; the shapes line up only then. (Its tokens differ from transformers': this test
    # compares SGLang with and without the plugin, not SGLang with transformers.)
    config = DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, n_group=1, topk_group=1, kv_lora_rank=32, q_lora_rank=48,
        qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=1024, bos_token_id=0, eos_token_id=0,
        num_nextn_predict_layers=0,
        # Fields of DeepSeek-V3's own config.json that SGLang reads and transformers does not keep.
        moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid", ep_size=1,
        # SGLang's CPU rotary embedding for DeepSeek models is YaRN's only, as in DeepSeek-V3.
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    )
    return _save(DeepseekV3ForCausalLM(config), path)


def serve_and_generate(model_path, *args) -> list[dict]:
    with http_server(model_path, *args) as url:
        outs = []
        for prompt in PROMPTS:
            r = requests.post(f"{url}/generate", timeout=300, json={
                "input_ids": prompt,
                "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}})
            assert r.status_code == 200, r.text
            outs.append(r.json())
        return outs


def plugin_on_and_off(model_path, *args) -> tuple[list[dict], list[dict]]:
    with_plugin = serve_and_generate(model_path, *args)
    with pytest.MonkeyPatch.context() as env:
        for k, v in PLUGIN_OFF.items():
            env.setenv(k, v)
        without = serve_and_generate(model_path, *args)
    return with_plugin, without


def assert_same(with_plugin, without):
    for on, off in zip(with_plugin, without):
        assert on["output_ids"] == off["output_ids"]
        assert len(on["output_ids"]) == NEW_TOKENS
        assert sorted(on["meta_info"]) == sorted(off["meta_info"])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("other_models")
    return {"llama": tiny_llama(root / "llama"), "deepseek_v3": tiny_deepseek_v3(root / "dsv3")}


@pytest.mark.parametrize("name", ["llama", "deepseek_v3"])
def test_same_tokens_and_meta_info_with_and_without_plugin(models, name):
    assert_same(*plugin_on_and_off(models[name]))


def test_plugin_filter_drops_both_entry_points(monkeypatch):
    """The control for the runs above: the allow-list really removes the plugin, the plugin's only
    entry point (it registers no SGLang platform)."""
    from importlib.metadata import entry_points

    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, PLATFORM_PLUGINS_GROUP, load_plugins_by_group

    assert [ep.name for ep in entry_points(group=PLATFORM_PLUGINS_GROUP)
            if ep.value.startswith("sglang_glm")] == []
    assert "glm_dsa" in load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    for k, v in PLUGIN_OFF.items():
        monkeypatch.setenv(k, v)
    assert "glm_dsa" not in load_plugins_by_group(GENERAL_PLUGINS_GROUP)


def test_the_plugins_backends_are_refused_for_other_models(models):
    """Asked for by name, a plugin backend would meet a Llama's KV pool at the first forward (an
    AttributeError inside the scheduler); the launch refuses it by flag and says what to do."""
    from serving import failed_launch

    log = failed_launch(models["llama"], "--attention-backend", "glm_dsa_torch")
    assert "--attention-backend glm_dsa_torch: the plugin's attention backends serve GLM-DSA models" in log, log[-3000:]
    assert "drop the flag" in log
