"""``tools add``: write a recipe's entries (model, Python pre/post models, pipeline) into the spec.

The entries are plain spec text the user reviews and edits; ``tools build-repo`` builds them.
"""
