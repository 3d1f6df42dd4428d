"""Who a job belongs to: API keys (tenants) and cache scopes (who may share prefix-cache blocks)."""
