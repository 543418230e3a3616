"""Drive a umockdev testbed from a test: plug, unplug and re-enumerate devices.

Runs under Debian's Python (it needs PyGObject and UMockdev's typelib) inside
``umockdev-wrapper``, so the process it spawns (the watcher under test) sees the
testbed through real libudev and receives its uevents through a real
``udev_monitor``. Reads one command per line on stdin, as a JSON array of words,
and answers ``ok`` or ``error: ...`` per line:

    plug FILE              add the device blocks of FILE not present yet, each with an "add" uevent
    unplug SYSPATH         "remove" uevent, then remove the device
    reenumerate SYSPATH FILE N   N times: unplug SYSPATH, plug FILE (2N events)
    spawn LOG ARGV...      start the program under test, output to LOG
    stop                   terminate it and exit
"""

import json
import os
import subprocess
import sys

import gi

gi.require_version("UMockdev", "1.0")
from gi.repository import UMockdev  # noqa: E402


def blocks(path):
    """(syspath, text) per device block of a umockdev file."""
    result = []
    for block in open(path).read().split("\n\n"):
        block = block.strip()
        if block:
            first = block.splitlines()[0]
            assert first.startswith("P: "), first
            result.append(("/sys" + first[3:].strip(), block + "\n"))
    return result


class Driver:
    def __init__(self, initial):
        self.testbed = UMockdev.Testbed.new()
        self.testbed.add_from_file(initial)
        self.root = self.testbed.get_root_dir()  # set via g_setenv, not in os.environ
        self.child = None

    def plug(self, path):
        for syspath, text in blocks(path):
            if not os.path.exists(self.root + syspath):
                self.testbed.add_from_string(text)
                self.testbed.uevent(syspath, "add")

    def unplug(self, syspath):
        self.testbed.uevent(syspath, "remove")
        self.testbed.remove_device(syspath)

    def handle(self, words):
        command = words[0]
        if command == "plug":
            self.plug(words[1])
        elif command == "unplug":
            self.unplug(words[1])
        elif command == "reenumerate":
            for _ in range(int(words[3])):
                self.unplug(words[1])
                self.plug(words[2])
        elif command == "spawn":
            log = open(words[1], "ab")
            self.child = subprocess.Popen(words[2:], stdout=log, stderr=subprocess.STDOUT)
        elif command == "stop":
            if self.child:
                self.child.terminate()
                self.child.wait(timeout=30)
            return False
        else:
            raise ValueError(f"unknown command {command}")
        return True


def main():
    driver = Driver(sys.argv[1])
    for line in sys.stdin:
        if not line.strip():
            continue
        words = json.loads(line)
        try:
            going = driver.handle(words)
            print("ok", flush=True)
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            print(f"error: {exc}", flush=True)
            going = True
        if not going:
            break


if __name__ == "__main__":
    main()
