"""`strata bench`: an async streaming client with per-chunk timestamps, a sampler of the server's process and
GPUs, and the scenarios that drive them (client, sampler, scenarios + features, run, report + plots)."""
