package main

import (
	"encoding/json"
	"os"
)

// epochMetrics is one line of the --metrics file; train.py writes the same fields.
type epochMetrics struct {
	Epoch            int     `json:"epoch"`
	Step             int     `json:"step"`
	Loss             float64 `json:"loss"`
	TestAccuracy     float64 `json:"test_accuracy"`
	SamplesPerSecond float64 `json:"samples_per_s"`
	Seconds          float64 `json:"seconds"`
	Ranks            int     `json:"ranks"`
}

// metricsLog writes JSON lines on rank 0 only; a nil log (no --metrics) writes nothing.
type metricsLog struct {
	f   *os.File
	enc *json.Encoder
}

func newMetricsLog(path string, rank int) (*metricsLog, error) {
	if path == "" || rank != 0 {
		return nil, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &metricsLog{f: f, enc: json.NewEncoder(f)}, nil
}

func (m *metricsLog) Write(e epochMetrics) error {
	if m == nil {
		return nil
	}
	return m.enc.Encode(e) // one line, written through: a killed run keeps its finished epochs
}

func (m *metricsLog) Close() error {
	if m == nil {
		return nil
	}
	return m.f.Close()
}
