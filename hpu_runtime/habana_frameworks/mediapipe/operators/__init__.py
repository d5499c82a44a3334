"""``mediapipe.operators``: placeholders."""
