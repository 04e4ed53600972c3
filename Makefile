# The README's two commands: `make demo` (set up + run the main job) and `make test` (set up + every test).
.PHONY: setup demo test bench
setup:
	bash scripts/setup.sh
demo: setup
	.venv/bin/quietfleet demo
test:
	bash scripts/test.sh
bench: setup
	.venv/bin/quietfleet bench --quick
