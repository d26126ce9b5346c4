"""The service core: sandbox lifecycle, jobs and state, independent of HTTP."""
