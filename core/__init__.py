"""The definitions both processes and loadgen share: vocabularies, errors, config fields,
request records, timing, outcomes, the tokenizer, the W3C trace context. Imports nothing of ours."""
