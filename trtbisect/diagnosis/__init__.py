"""Why a culprit fails: detection as data (detect.py, facts.py), the diagnosis with its fixes (diagnose.py), their words (wording.py) and checked advice."""
