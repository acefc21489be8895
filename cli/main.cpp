// servetune entry point: parses the command line, dispatches to a subcommand, maps errors to exit codes
// (0 ok, 1 failure, 2 usage error) with one message on stderr.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "servetune/error.h"

int main(int argc, char** argv) {
  CLI::App app{"servetune: serve, benchmark and autotune LLM inference engines", "servetune"};
  app.set_version_flag("--version", std::string("servetune ") + SERVETUNE_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  servetune::cli::add_all_commands(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "servetune: error: %s\nRun 'servetune --help' for usage.\n", e.what());
    return 2;
  } catch (const servetune::Error& e) {
    std::fprintf(stderr, "servetune: error: %s\n", e.what());
    return e.kind() == servetune::ErrorKind::kUsage ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "servetune: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
