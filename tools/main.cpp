// pagedmha: replay request traces through the attention backend, benchmark and check the ops.
#include "cli.h"

int main(int argc, char** argv) { return pagedmha::tools::run_cli(argc, argv); }
