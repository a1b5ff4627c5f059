# Runs CLI with ARGS ("|"-separated) and checks its exit status (EXIT) and that its stderr
# matches STDERR_REGEX: ctest's own properties cannot check both.
string(REPLACE "|" ";" arguments "${ARGS}")
execute_process(COMMAND ${CLI} ${arguments} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL EXIT)
  message(FATAL_ERROR "flashattn ${arguments}: exit status ${status}, expected ${EXIT}\nstdout: ${out}\nstderr: ${err}")
endif()
if(NOT err MATCHES "${STDERR_REGEX}")
  message(FATAL_ERROR "flashattn ${arguments}: stderr does not match '${STDERR_REGEX}':\n${err}")
endif()
