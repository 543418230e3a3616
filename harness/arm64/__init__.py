"""The arm64 CI leg's Python side (scripts/ci-arm64.sh runs the leg itself): runner results that
one architecture writes and another compares (:mod:`.parity`)."""
