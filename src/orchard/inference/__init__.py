"""Model servers that speak OpenAI chat completions with token ids and logprobs: scripted and local transformers."""
