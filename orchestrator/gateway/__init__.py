"""`sparkctl gateway`: one OpenAI endpoint over the running servers (docs/gateway.md). Above
engines/ (it reads every engine's running servers and their API keys); the pieces `down` and
the relays share stay below, in phases/ (gateway_spec, gateway_relays, gateway_down)."""
