# Turns schema/NNN_name.sql files into a C++ table the journal applies by PRAGMA user_version.
# Run by the build (cmake -P) so that no generated file is committed.
#   -DOUT=<file.cc> -DFILES=<a|b|c>
string(REPLACE "|" ";" FILES "${FILES}")
list(SORT FILES)
set(body "")
foreach(f IN LISTS FILES)
  get_filename_component(name "${f}" NAME)
  string(REGEX MATCH "^([0-9]+)_" _ "${name}")
  if(NOT CMAKE_MATCH_1)
    message(FATAL_ERROR "migration ${name} must start with a version number: 001_name.sql")
  endif()
  math(EXPR version "${CMAKE_MATCH_1} + 0")
  file(READ "${f}" sql)
  string(APPEND body "    {${version}, \"${name}\", R\"knodsql(${sql})knodsql\"},\n")
endforeach()
file(WRITE "${OUT}.tmp" "// Generated from schema/*.sql by cmake/embed_migrations.cmake.\n"
  "#include \"journal/migrations.h\"\n\n"
  "namespace knod::journal {\n"
  "const std::vector<Migration> &migrations() {\n"
  "    static const std::vector<Migration> all = {\n${body}    };\n"
  "    return all;\n}\n} // namespace knod::journal\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
