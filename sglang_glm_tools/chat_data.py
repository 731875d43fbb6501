"""Synthetic GLM-format conversations for the chat fine-tune (benchmarks/train/finetune_chat.py):
reasoning, tool calls, tool results; its tools are the ones the chat tests offer the served model.

Each conversation is a list of OpenAI-style messages plus the tools offered, rendered with the
checkpoint's own chat template (`sglang_glm_tools.chat_format`), so training text and served prompts
share one format. Seeded: the same seed gives the same conversations.
"""

from __future__ import annotations

import json
import random

CITIES = ["Paris", "London", "Berlin", "Tokyo", "Madrid", "Rome", "Oslo", "Cairo", "Lima", "Seoul",
          "Dublin", "Vienna", "Prague", "Lisbon", "Athens", "Boston", "Denver", "Sydney", "Nairobi", "Quito"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"]
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid", "Norway": "Oslo",
            "Egypt": "Cairo", "Peru": "Lima", "Ireland": "Dublin", "Austria": "Vienna", "Greece": "Athens"}
GREETINGS = ["Hello!", "Hi there.", "Good morning!", "Hey, how are you?", "Thanks for your help."]
REPLIES = ["Hello! How can I help you today?", "Hi! What can I do for you?",
           "Good morning! How can I help?", "I am fine, thank you. How can I help?",
           "You are welcome! Anything else?"]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOLS = [WEATHER_TOOL, ADD_TOOL, TIME_TOOL]


def _call(name: str, args: dict) -> dict:
    # Arguments as a dict: SGLang parses the OpenAI JSON string before it renders the template.
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": args}}


def _tool_turns(rng: random.Random) -> tuple[list[dict], list[dict]]:
    """user question -> reasoning + tool call -> tool result -> reasoning + answer."""
    kind = rng.choice(["weather", "add", "time"])
    if kind == "weather":
        city, cond, temp = rng.choice(CITIES), rng.choice(CONDITIONS), rng.randint(-5, 35)
        q = rng.choice([f"What is the weather in {city}?", f"How is the weather in {city} today?",
                        f"Is it warm in {city} right now?"])
        call, result = _call("get_weather", {"city": city}), {"city": city, "condition": cond, "temperature": temp}
        think1 = f"The user asks about the weather in {city}. I will call get_weather."
        think2 = f"The tool says it is {cond} and {temp} degrees in {city}."
        answer = f"It is {cond} in {city}, {temp} degrees Celsius."
    elif kind == "add":
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        q = rng.choice([f"What is {a} plus {b}?", f"Add {a} and {b}.", f"Compute {a} + {b}."])
        call, result = _call("add", {"a": a, "b": b}), {"result": a + b}
        think1 = f"The user wants {a} + {b}. I will call add."
        think2 = f"The tool returned {a + b}."
        answer = f"{a} + {b} = {a + b}."
    else:
        city, h, m = rng.choice(CITIES), rng.randint(0, 23), rng.randint(0, 59)
        q = rng.choice([f"What time is it in {city}?", f"Tell me the local time in {city}."])
        call, result = _call("get_time", {"city": city}), {"city": city, "time": f"{h:02d}:{m:02d}"}
        think1 = f"The user asks for the time in {city}. I will call get_time."
        think2 = f"The tool says it is {h:02d}:{m:02d} in {city}."
        answer = f"It is {h:02d}:{m:02d} in {city}."
    tools = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
    if call["function"]["name"] not in [t["function"]["name"] for t in tools]:
        tools.append(next(t for t in TOOLS if t["function"]["name"] == call["function"]["name"]))
    messages = [
        {"role": "user", "content": q},
        {"role": "assistant", "content": "", "reasoning_content": think1, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)},
        {"role": "assistant", "content": answer, "reasoning_content": think2},
    ]
    return messages, tools


def _chat_turns(rng: random.Random) -> tuple[list[dict], list[dict] | None]:
    """Questions that need no tool, with reasoning (sometimes tools offered anyway)."""
    if rng.random() < 0.5:
        country = rng.choice(list(CAPITALS))
        q, think = f"What is the capital of {country}?", f"The capital of {country} is {CAPITALS[country]}."
        answer = f"The capital of {country} is {CAPITALS[country]}."
    else:
        i = rng.randrange(len(GREETINGS))
        q, think, answer = GREETINGS[i], "The user greets me. I should answer politely.", REPLIES[i]
    messages = [{"role": "user", "content": q}, {"role": "assistant", "content": answer, "reasoning_content": think}]
    return messages, (rng.sample(TOOLS, rng.randint(1, 2)) if rng.random() < 0.3 else None)


def conversation(rng: random.Random) -> tuple[list[dict], list[dict] | None, bool]:
    """(messages, tools, thinking): 60% tool use, 40% plain chat; 20% with thinking switched off."""
    messages, tools = _tool_turns(rng) if rng.random() < 0.6 else _chat_turns(rng)
    if rng.random() < 0.3:
        messages = [{"role": "system", "content": "You are a helpful assistant."}] + messages
    thinking = rng.random() >= 0.2
    if not thinking:
        messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
    return messages, tools, thinking


def render(tokenizer, messages, tools) -> str:
    """One training document: the template's rendering, then `<|user|>`, the token that ends the last turn."""
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    return text + "<|user|>"
