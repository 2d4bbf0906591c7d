# The tool's library, and the default CPU replay (with its checks) as a CI test.
target_link_libraries(${target} PRIVATE pagedmha_tools)
if(TARGET pagedmha_cli AND NOT TEST tools_replay_default)
  add_test(NAME tools_replay_default COMMAND pagedmha_cli replay --device cpu --no-progress)
  set_tests_properties(tools_replay_default PROPERTIES LABELS cpu TIMEOUT 600)
endif()
