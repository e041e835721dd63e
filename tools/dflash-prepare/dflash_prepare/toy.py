"""A small, learnable stand-in for real chat data, tokenizer and target, made
on the spot (no network): for tests and scripts/device-real-data.sh.

`make_corpus` needs nothing but the standard library. `build_tokenizer`
needs `tokenizers` and `transformers`, `build_target` also `torch`.
"""
import json
import random

# A Qwen-style chat template with generation markers around what the
# assistant generates: its reasoning, content, tool calls and <|im_end|>.
QWEN_STYLE_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{%- if message.reasoning_content %}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message.content }}"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n' + (call.function | tojson) + '\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# The same template without the markers: loss masks then come from prefixes.
QWEN_STYLE_TEMPLATE_PLAIN = (QWEN_STYLE_TEMPLATE
                             .replace("{%- generation %}", "")
                             .replace("{%- endgeneration %}", ""))

# Like Qwen3's own template: reasoning shown only on the last assistant turn,
# so an earlier turn renders differently once later turns follow (no prefix
# property for conversations with reasoning in an earlier turn).
QWEN_STYLE_TEMPLATE_LAST_REASONING = QWEN_STYLE_TEMPLATE_PLAIN.replace(
    "{%- if message.reasoning_content %}",
    "{%- if message.reasoning_content and loop.last %}")

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
                  "</think>", "<tool_call>", "</tool_call>"]

WORDS = (
    "apple banana cherry grape lemon mango melon olive peach pear plum berry "
    "red blue green yellow purple orange black white silver golden brown pink "
    "cat dog fox owl bear wolf lion tiger horse mouse eagle shark whale snake "
    "river ocean mountain forest desert valley island meadow canyon glacier "
    "north south east west spring summer autumn winter morning evening night "
    "table chair window door garden kitchen bridge tower castle market school "
    "quick slow bright dark quiet loud happy calm brave gentle clever proud "
    "run jump swim fly read write sing dance build paint climb travel").split()

SYSTEM_PROMPTS = ["You are a helpful assistant.",
                  "You are a careful assistant that follows instructions exactly.",
                  "Answer briefly."]


def _task(rng):
    """One user request and the answer it determines."""
    kind = rng.choice(["repeat", "reverse", "sort", "count", "spell", "upper", "pairs"])
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
    if kind == "repeat":
        return f"repeat: {' '.join(words)}", " ".join(words), "copy the words in order"
    if kind == "reverse":
        return (f"reverse: {' '.join(words)}", " ".join(reversed(words)),
                "the same words, last first")
    if kind == "sort":
        return (f"sort: {' '.join(words)}", " ".join(sorted(words)),
                "the words in alphabetical order")
    if kind == "count":
        start = rng.randint(1, 40)
        end = start + rng.randint(3, 9)
        return (f"count from {start} to {end}",
                " ".join(str(i) for i in range(start, end + 1)), "every number in between")
    if kind == "spell":
        word = words[0]
        return f"spell: {word}", " ".join(word), "one letter at a time"
    if kind == "upper":
        return f"upper: {' '.join(words)}", " ".join(words).upper(), "capital letters"
    return (f"pairs: {' '.join(words[:4])}",
            " ".join(f"{w}-{w}" for w in words[:4]), "each word twice, joined")


def make_conversation(rng):
    """OpenAI-form messages: an optional system prompt, 1-3 exchanges, at
    times reasoning, at times a tool call and its result."""
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for _ in range(rng.randint(1, 3)):
        request, answer, why = _task(rng)
        messages.append({"role": "user", "content": request})
        if rng.random() < 0.15:
            word = rng.choice(WORDS)
            messages.append({"role": "assistant", "content": "",
                             "tool_calls": [{"type": "function", "function": {
                                 "name": "lookup", "arguments": {"word": word}}}]})
            messages.append({"role": "tool", "content": f"{word}: a common word"})
        reply = {"role": "assistant", "content": answer}
        if rng.random() < 0.3:
            reply["reasoning_content"] = f"The user wants {why}."
        messages.append(reply)
    return messages


def to_sharegpt(messages):
    names = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}
    return {"conversations": [{"from": names[m["role"]], "value": m["content"]}
                              for m in messages if not m.get("tool_calls")]}


def make_corpus(count, seed=0, sharegpt_share=0.2):
    """`count` records (dicts), deterministic for a seed; about
    `sharegpt_share` of them in ShareGPT form (without tool calls)."""
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        messages = make_conversation(rng)
        if rng.random() < sharegpt_share:
            records.append(to_sharegpt(messages))
        else:
            records.append({"messages": messages})
    return records


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def corpus_texts(records):
    """Plain text of every turn, to train a tokenizer on."""
    texts = []
    for record in records:
        turns = record.get("messages") or record.get("conversations") or []
        for turn in turns:
            for key in ("content", "value", "reasoning_content"):
                if isinstance(turn.get(key), str) and turn[key]:
                    texts.append(turn[key])
            for call in turn.get("tool_calls") or []:
                texts.append(json.dumps(call["function"]))
    texts += ["system", "user", "assistant", "tool", "\n", "\n\n"]
    return texts


def build_tokenizer(directory, texts, vocab_size=512, template=QWEN_STYLE_TEMPLATE,
                    mask_token=None):
    """Trains a byte-level BPE tokenizer on `texts`, wraps it as a
    PreTrainedTokenizerFast with `template` and saves it to `directory`.
    Returns the tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import transformers

    specials = SPECIAL_TOKENS + ([mask_token] if mask_token else [])
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1,
                                  special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    # The trainer made every special token an atomic added token already.
    extra = {"mask_token": mask_token} if mask_token else {}
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        **extra)
    fast.chat_template = template
    fast.save_pretrained(directory)
    return fast


def build_target(directory, spec, seed=0, intermediate_size=None, heads=None):
    """A random-initialised Qwen3 causal LM whose hidden size, layer count and
    vocabulary are the spec's target's, saved with save_pretrained (bf16)."""
    import torch
    import transformers

    H = spec.hidden_size
    heads = heads or max(1, min(8, H // 32))
    while H % heads:
        heads -= 1
    kv_heads = heads // 2 if heads % 2 == 0 else heads
    config = transformers.Qwen3Config(
        vocab_size=spec.vocab_size, hidden_size=H,
        intermediate_size=intermediate_size or 2 * H,
        num_hidden_layers=spec.target_num_layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=H // heads,
        max_position_embeddings=max(4096, 2 * spec.seq_len), rms_norm_eps=1e-6,
        rope_theta=1e6, tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)
    return model
