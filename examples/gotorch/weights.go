package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// saveWeights writes the parameters and momentum buffers in the checkpoint
// format of examples/mnist (mnist_format.py: magic, epochs and steps, then 8
// float32 tensors with their shapes), so the Python tools and tests read it.
func (t *trainer) saveWeights(path string, epoch, step int) error {
	var buf bytes.Buffer
	buf.WriteString("PBMLP01\n")
	binary.Write(&buf, binary.LittleEndian, [2]uint64{uint64(epoch), uint64(step)})
	binary.Write(&buf, binary.LittleEndian, uint32(8))
	n := t.model.NumParams()
	for k := 0; k < 2*n; k++ {
		_, count, shape, err := t.model.Param(k % n)
		if err != nil {
			return err
		}
		var data []float32
		if k < n {
			data, err = t.model.HostParam(k)
		} else {
			data, err = t.model.Momentum(k - n)
		}
		if err != nil {
			return err
		}
		if data == nil {
			data = make([]float32, count)
		}
		binary.Write(&buf, binary.LittleEndian, uint32(len(shape)))
		for _, d := range shape {
			binary.Write(&buf, binary.LittleEndian, uint32(d))
		}
		binary.Write(&buf, binary.LittleEndian, data)
	}
	tmp := fmt.Sprintf("%s.tmp%d", path, os.Getpid())
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// dataKind reads the prepared folder's manifest: real MNIST or synthetic digits.
func dataKind(folder string) string {
	raw, err := os.ReadFile(filepath.Join(folder, "manifest.json"))
	if err != nil {
		return "unknown (no manifest.json)"
	}
	var m struct {
		Kind string `json:"kind"`
	}
	if json.Unmarshal(raw, &m) != nil || m.Kind == "" {
		return "unknown"
	}
	if m.Kind == "mnist" {
		return "real MNIST"
	}
	return "synthetic digits (SYNTHETIC: not real MNIST)"
}
