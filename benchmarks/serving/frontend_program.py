"""An SGLang frontend-language program against the plugin's server (`sgl.function` + `RuntimeEndpoint`).

It exercises what SGLang programs use: a multi-turn chat (the `default` chat template: the bundled
model has none of its own), fork/join, a constrained choice with `sgl.select`, and regex-constrained
`sgl.gen`. Every greedy `gen` records the exact text it was prompted with (`s.text()` just before
it), so a checker can send the same prompt through `/generate` and demand identical output.

    python benchmarks/serving/frontend_program.py --url http://127.0.0.1:30000

The bundled model (glm-dsa-mini) was trained on Python source, so the "conversation" is about code;
what matters here is that the program's structure runs through the plugin's server unchanged.
"""

from __future__ import annotations

import argparse
import json

import sglang as sgl

SNIPPETS = [
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
    "class Decoder(object):\n    def __init__(self, *, object_hook=None,",
]
KINDS = ["function", "class", "module"]
NAME_REGEX = r"[a-z_][a-z0-9_]{2,12}"
NUMBER_REGEX = r"[1-9][0-9]?"
ASPECTS = ["What does it return?", "Which module does it need?"]
GEN_TOKENS = 24


@sgl.function
def review(s, snippet: str):
    s += sgl.system("You read Python code and answer briefly.")

    # Turn 1: free greedy completion.
    s += sgl.user("Continue this code:\n" + snippet)
    s += sgl.assistant_begin()
    s["prompt_completion"] = s.text()
    s += sgl.gen("completion", max_tokens=GEN_TOKENS, temperature=0)
    s += sgl.assistant_end()

    # Turn 2: constrained choice.
    s += sgl.user("Is the code above a function, a class or a module?")
    s += sgl.assistant(sgl.select("kind", choices=KINDS))

    # Turn 3: regex-constrained name.
    s += sgl.user("Give a short snake_case name for it.")
    s += sgl.assistant_begin()
    s["prompt_name"] = s.text()
    s += sgl.gen("name", regex=NAME_REGEX, max_tokens=16, temperature=0)
    s += sgl.assistant_end()

    # Fork: two independent follow-up questions from the same state, then join.
    forks = s.fork(len(ASPECTS))
    for f, question in zip(forks, ASPECTS):
        f += sgl.user(question)
        f += sgl.assistant_begin()
        f["prompt_aspect"] = f.text()
        f += sgl.gen("aspect", max_tokens=12, temperature=0, stop="\n")
        f += sgl.assistant_end()
    forks.join()

    # Back on the main branch, the fork answers are gathered as lists.
    s += sgl.user("In how many lines could it be written?")
    s += sgl.assistant_begin()
    s["prompt_lines"] = s.text()
    s += sgl.gen("lines", regex=NUMBER_REGEX, max_tokens=4, temperature=0)
    s += sgl.assistant_end()


GREEDY_GENS = {  # variable -> (prompt variable, sampling params the frontend sent)
    "completion": ("prompt_completion", {"max_new_tokens": GEN_TOKENS, "temperature": 0}),
    "name": ("prompt_name", {"max_new_tokens": 16, "temperature": 0, "regex": NAME_REGEX}),
    "lines": ("prompt_lines", {"max_new_tokens": 4, "temperature": 0, "regex": NUMBER_REGEX}),
}
FORK_GEN = ("aspect", "prompt_aspect", {"max_new_tokens": 12, "temperature": 0, "stop": "\n"})


def run(url: str, snippets=SNIPPETS) -> list[dict]:
    """Runs `review` over the snippets as a batch; returns each state's variables and full text."""
    sgl.set_default_backend(sgl.RuntimeEndpoint(url))
    states = review.run_batch([{"snippet": x} for x in snippets], num_threads=2, progress_bar=False)
    out = []
    for st in states:
        err = st.error()
        if err is not None:
            raise RuntimeError(f"frontend program failed: {err!r}")
        rec = {k: st[k] for k in ("completion", "kind", "name", "lines", "aspect",
                                  "prompt_completion", "prompt_name", "prompt_lines",
                                  "prompt_aspect")}
        rec["text"] = st.text()
        rec["kind_meta"] = st.get_meta_info("kind")
        out.append(rec)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    args = ap.parse_args()
    for rec in run(args.url):
        print(rec["text"])
        print(json.dumps({k: rec[k] for k in ("completion", "kind", "name", "lines", "aspect")},
                         indent=1))
        print("-" * 60)


if __name__ == "__main__":
    main()
