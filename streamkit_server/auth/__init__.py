"""Who is calling and what they may do: authentication, roles, principals, tokens, rate limits."""
