module github.com/pybridge/pybridge/examples/gotorch

go 1.22

require github.com/pybridge/pybridge/go v0.0.0

replace github.com/pybridge/pybridge/go => ../../go
