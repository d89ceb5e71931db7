"""The OpenAI and TEI HTTP APIs in front of Triton: an ASGI app whose routes follow the kinds of
the served pipelines (embedder, reranker, classifier), one Triton request per list of inputs.
"""
