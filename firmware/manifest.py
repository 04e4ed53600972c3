# Freeze the QuietFleet agent into a MicroPython firmware image (DESIGN.md §7):
#   make -C ports/esp32 BOARD=ESP32_GENERIC FROZEN_MANIFEST=/path/to/quietfleet/firmware/manifest.py
# (rp2: make -C ports/rp2 BOARD=RPI_PICO_W FROZEN_MANIFEST=...). Frozen bytecode runs from flash,
# so the agent then costs almost no heap; boot.py/main.py and qf.json stay on the filesystem.
include("$(PORT_DIR)/boards/manifest.py")
module("qfboard.py", base_path="$(MPY_DIR)/../quietfleet/firmware")
package("edge", base_path="$(MPY_DIR)/../quietfleet")
module("link.py", base_path="$(MPY_DIR)/../quietfleet/edge/runtime/micropython")
module("qfagent.py", base_path="$(MPY_DIR)/../quietfleet/edge/runtime/micropython")
package("umqtt", base_path="$(MPY_DIR)/../quietfleet/edge/runtime/micropython")
