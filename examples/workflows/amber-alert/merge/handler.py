"""Writes the alert from face and pose recognition (a fan-in node: its input is
{"faces": ..., "poses": ...})."""

from dilu import Handler, InputError


class Merge(Handler):
    def predict(self, inputs):
        results = []
        for item in inputs:
            if not isinstance(item, dict) or not {"faces", "poses"} <= set(item):
                results.append(InputError("expected the outputs of faces and poses"))
                continue
            faces, poses = item["faces"], item["poses"]
            text = f"alert: person {faces['identity']} seen {poses['posture']}"
            results.append({"alert": text, "confidence": faces["confidence"], "language": faces["language"]})
        return results
