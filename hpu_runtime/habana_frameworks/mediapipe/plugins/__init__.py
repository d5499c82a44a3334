"""``mediapipe.plugins``: placeholders."""
