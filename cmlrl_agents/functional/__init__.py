"""Pure math on tensors: returns, advantages and losses, tested without a model."""
