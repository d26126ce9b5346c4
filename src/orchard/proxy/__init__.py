"""The harness proxy: speaks each harness's model API, forwards to an OpenAI-compatible engine and records every call."""
