package main

import "github.com/pybridge/pybridge/examples/mnist/mnistdata"

// saveWeights writes the parameters and momentum buffers in the checkpoint
// format of examples/mnist (mnist_format.py), so the Python tools and tests read it.
func (t *trainer) saveWeights(path string, epoch, step int) error {
	n := t.model.NumParams()
	shapes, tensors := make([][]int, 2*n), make([][]float32, 2*n)
	for k := range tensors {
		_, count, shape, err := t.model.Param(k % n)
		if err != nil {
			return err
		}
		tensors[k], err = t.model.HostCopy(k%n, k >= n)
		if err != nil {
			return err
		}
		if tensors[k] == nil {
			tensors[k] = make([]float32, count)
		}
		shapes[k] = shape
	}
	return mnistdata.WriteWeights(path, epoch, step, shapes, tensors)
}
