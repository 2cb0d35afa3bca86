"""The advisor: recipe knowledge base, retrieval, GraphRAG over the causal subgraph, LLM client."""
