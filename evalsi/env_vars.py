"""What the collector's config and the policy files share about environment variables: the error for one that is
unset, naming the variable, where it is read and how to set it."""

from __future__ import annotations


def unset_variable(where: str, name: str) -> str:
    """The error for an unset environment variable the config reads at `where` (a key path): which variable, where,
    how to set it (for an API key's hash: `evalsi keys new`). The `export` comes last: for a secret-named variable
    the error's redaction masks what follows its `=`."""
    how = f"export {name}=..."
    if name.endswith("_HASH") or where.endswith(".hash"):
        how = f"export {name}=<the hash `evalsi keys new` prints>"
        if name == "EVALSI_API_KEY_HASH":
            how = f'eval "$(evalsi keys new --export)" (a new key: its hash, and the key as EVALSI_API_KEY), or {how}'
    return f"{where}: environment variable {name} is not set; this key reads it. Set it first: {how}"
