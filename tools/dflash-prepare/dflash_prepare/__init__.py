"""dflash-prepare: chat JSONL -> token shards -> feature shards, and checks.

Modules by job: `chat` reads conversations, `template` turns one into token
ids and a loss mask with the tokenizer's chat template, `packing` fills rows,
`shards` reads and writes safetensors with numpy alone, `tokens` and
`features` are the two writing commands, `check` validates a shard set
against a spec. Heavy packages (transformers, tokenizers, torch) are imported
only by the commands that need them (`errors.require`).
"""
