"""LLM agents and their parts: model loading, tokens, generation, reference models, value heads."""
