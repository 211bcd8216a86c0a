# Sourced by the GPU scripts: the vLLM that tools/gpu/vllm_judge.sh install puts in /tmp/vsite (every .gpu-vllm part),
# checked and put first on the Python path in one place.
vsite_check() {  # $1: what needs vLLM (named in the error); 1 with the staging step named when it is not installed
  [ -f /tmp/vsite/.compeer-vllm ] || { echo "$1 needs vLLM, which is not installed in /tmp/vsite: run \
tools/gpu/vllm_judge.sh install with each .gpu-vllm/pK first (docs/gpu.md)" >&2; return 1; }
}
vsite_path() {  # /tmp/vsite first on PYTHONPATH (once), FlashInfer's sampler off (not in the staged wheels)
  case ":${PYTHONPATH:-}:" in *:/tmp/vsite:*) ;; *) export PYTHONPATH=/tmp/vsite:${PYTHONPATH:-} ;; esac
  export VLLM_USE_FLASHINFER_SAMPLER=0
}
vsite_use() { vsite_check "$1" && vsite_path; }  # $1 as in vsite_check
