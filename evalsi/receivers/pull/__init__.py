"""Pull receivers: read traces where they already are (an MLflow tracking server, ...) on a schedule, with a
watermark kept in the store, and hand them to the traces pipeline like OTLP traffic."""
