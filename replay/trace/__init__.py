"""`replay trace`: a snapshot's calls by step and layer, with their kernel launches (timeline.py),
as nested slices (slices.py) drawn as a Chrome trace (chrome.py) or one HTML page (html.py)."""
