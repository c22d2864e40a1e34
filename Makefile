# make install: builds strata and installs it as $(DESTDIR)$(PREFIX)/bin/strata,
# the path deploy/systemd/strata.service runs. Without root:
# make install PREFIX=$$HOME/.local. Packagers set DESTDIR.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
# sudo resets PATH: look for go where its installers put it too.
# Where the build goes before install copies it (git-ignored ./strata).
OUT ?= strata
GO ?= $(shell command -v go 2>/dev/null || ls /usr/local/go/bin/go /usr/lib/go/bin/go 2>/dev/null | head -n1)

.PHONY: all build install uninstall test
all: build

build:
	@test -n "$(GO)" || { echo "make: the go command is not on PATH (under sudo: sudo env PATH=\"\$$PATH\" make install)" >&2; exit 2; }
	$(GO) build -trimpath -o $(OUT) ./cmd/strata

install: build
	install -D -m 0755 $(OUT) $(DESTDIR)$(BINDIR)/strata
	@echo "installed $(DESTDIR)$(BINDIR)/strata ($$($(DESTDIR)$(BINDIR)/strata version 2>/dev/null | head -n1))"

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/strata

# The README's test command.
test:
	$(GO) run ./internal/testrun
