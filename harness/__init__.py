"""What the tests, the demo and the benchmarks use to stand a product up, kept out of the packages a
server image runs: a server child process on a free port (`server_process`) and tiny random QA
checkpoints and exports (`tiny_models`)."""
