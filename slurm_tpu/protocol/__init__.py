"""Every format that crosses a process or privilege boundary: one writer and one reader each."""
