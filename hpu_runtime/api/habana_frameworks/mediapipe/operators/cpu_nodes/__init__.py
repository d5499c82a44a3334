"""``mediapipe.operators.cpu_nodes``: placeholders."""
