module github.com/pybridge/pybridge/go

go 1.22
