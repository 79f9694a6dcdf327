"""The built-in evaluator packs; importing this package registers every `builtin/*` evaluator."""
