package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// doctorEngine is one engine the doctor checks for: the memory it hands the
// service, and the flags that load its plugin.
type doctorEngine struct {
	name string
	// module is the plugin's Python module, whose doctor checks from the
	// engine's python what this one cannot: that the plugin loads there.
	module string
	// segment describes the memory ("a shm host pool built the way SGLang builds it").
	segment string
	// makeSegment returns a descriptor of size bytes of that memory.
	makeSegment func(size int) (int, error)
	flags       func(socket string) string
}

// doctorEngines are the engines --engine names, in the order "all" checks them.
var doctorEngines = []doctorEngine{
	{"SGLang", "strata_sglang", "a shm host pool built the way SGLang builds it (an unsealed memfd)", sglangHostPool, sglangFlags},
	{"vLLM", "strata_vllm", "a CPU-tier file built the way vLLM builds its rows (a 0600 file on /dev/shm)", vllmRowsFile, vllmFlags},
}

// sglangHostPool makes memory the way SGLang's ShmHostTensorAllocator does.
func sglangHostPool(size int) (int, error) {
	fd, err := unix.MemfdCreate("sglang_host_pool_doctor", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("ftruncate memfd: %w", err)
	}
	return fd, nil
}

// vllmRowsFile makes memory the way vLLM keeps its CPU tier: a 0600 file on
// /dev/shm (removed at once: the descriptor keeps it).
func vllmRowsFile(size int) (int, error) {
	f, err := os.CreateTemp("/dev/shm", "strata_doctor_vllm_offload_")
	if err != nil {
		return -1, err
	}
	_ = os.Remove(f.Name())
	fd, err := unix.Dup(int(f.Fd()))
	_ = f.Close()
	if err != nil {
		return -1, fmt.Errorf("dup: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("ftruncate %s: %w", f.Name(), err)
	}
	return fd, nil
}

// inlineJSON encodes v as Python's json.dumps(v, separators=(",", ":")) does
// for ASCII: the engines' flags are checked against the Python doctors'.
func inlineJSON(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // plain structs of strings and numbers always encode
	return strings.TrimSuffix(b.String(), "\n")
}

// sglangFlags are the SGLang flags that load the plugin against socket, as
// python/strata_sglang/doctor.py's sglang_flags prints them (inline JSON: it must be).
func sglangFlags(socket string) string {
	cfg := struct {
		BackendName string `json:"backend_name"`
		ModulePath  string `json:"module_path"`
		ClassName   string `json:"class_name"`
		InterfaceV1 int    `json:"interface_v1"`
		Allocator   string `json:"allocator"`
		Socket      string `json:"socket"`
	}{"strata", "strata_sglang", "StrataStorage", 1, "shm", socket}
	return "--enable-hierarchical-cache --hicache-storage-backend dynamic --hicache-storage-backend-extra-config '" + inlineJSON(cfg) + "'"
}

// vllmFlags is vLLM's --kv-transfer-config that loads the tier against socket,
// as python/strata_vllm/doctor.py's kv_transfer_config prints it.
func vllmFlags(socket string) string {
	type tier struct {
		Type       string `json:"type"`
		ModulePath string `json:"module_path"`
		Socket     string `json:"socket"`
	}
	type extra struct {
		SpecName       string `json:"spec_name"`
		CPUBytesToUse  int64  `json:"cpu_bytes_to_use"`
		SecondaryTiers []tier `json:"secondary_tiers"`
	}
	cfg := struct {
		Connector string `json:"kv_connector"`
		Role      string `json:"kv_role"`
		Extra     extra  `json:"kv_connector_extra_config"`
	}{"OffloadingConnector", "kv_both", extra{"TieringOffloadingSpec", 8 << 30, []tier{{"StrataTier", "strata_vllm", socket}}}}
	return "--kv-transfer-config '" + inlineJSON(cfg) + "'"
}
