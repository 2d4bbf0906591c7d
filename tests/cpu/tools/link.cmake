# The tool's library, and the default CPU replay (with its checks) as a CI test.
target_link_libraries(${target} PRIVATE pagedmha_tools)
if(TARGET pagedmha_cli AND NOT TEST tools_replay_default)
  add_test(NAME tools_replay_default COMMAND pagedmha_cli replay --device cpu --no-progress)
  set_tests_properties(tools_replay_default PROPERTIES LABELS cpu TIMEOUT 600)
endif()
# scripts/replay.sh run from another folder keeps that folder for relative paths (--json
# lands there). The script builds the default preset, so only that build runs this test
# (where the build is already up to date); RUN_SERIAL keeps its no-op rebuild alone.
if(CMAKE_BINARY_DIR STREQUAL "${PROJECT_SOURCE_DIR}/build/default" AND NOT TEST tools_replay_sh_caller_dir)
  add_test(NAME tools_replay_sh_caller_dir
           COMMAND bash -c "rm -f replay_sh.json && bash '${PROJECT_SOURCE_DIR}/scripts/replay.sh' --device cpu \
--requests 2 --layers 1 --check-every 0 --no-progress --quiet --json replay_sh.json && test -s replay_sh.json"
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(tools_replay_sh_caller_dir PROPERTIES LABELS cpu TIMEOUT 600 RUN_SERIAL TRUE)
endif()
