"""Sample float32 kernels, checked against refreplay's golden vectors."""
