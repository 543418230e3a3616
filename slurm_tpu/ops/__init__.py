"""Operations: node health (drain/resume), the hotplug watcher, metrics, accounting."""
