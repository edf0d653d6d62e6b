// Runs the kvlab CLI over a table of command lines and checks each one's exit status and
// a fragment of its output, its wall time and its peak memory: the bad-input table
// (tests/cli/bad_input.txt) and the smoke runs, under the sanitizers in the asan
// configuration.
//
//   cli_table <kvlab> <table> <fixtures dir> <scratch dir>
//
// Table rows: `EXIT | FRAGMENT | ARGUMENTS`, '#' starts a comment line. ARGUMENTS are
// split like a shell's words ('single' and "double" quotes group; no escapes), and
// @F/ and @T/ expand to the fixtures and the scratch directory. FRAGMENT must occur in
// stdout + stderr (empty: not checked). A row also fails when the command runs longer
// than the time limit or its peak RSS exceeds the memory limit: "no input runs away";
// `EXIT@MiB` sets a row's own, tighter memory limit (the streaming file tools).
// The scratch directory is made afresh with the generated fixtures (files too large or
// too odd to check in). Prints one line per row and `N passed, M failed` at the end.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;

// Runaway guards, not speed targets: a correct CLI answers these rows quickly, and the
// limits leave room for ASan+UBSan on a loaded 2-core CI machine (docs/ci.md §Test costs).
constexpr double kTimeLimitSeconds = 30;
constexpr long kRssLimitKiB = 1536 * 1024;

struct Row {
  int line = 0;
  int exit = 0;
  long rss_limit_kib = kRssLimitKiB;  // "EXIT@MiB" sets a tighter one
  std::string fragment;
  std::vector<std::string> args;
};

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t i = s.find(from); i != std::string::npos; i = s.find(from, i + to.size())) s.replace(i, from.size(), to);
  return s;
}

std::vector<std::string> words(const std::string& s, int line) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (const char c : s) {
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        cur += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t') {
      if (in_word) out.push_back(cur);
      cur.clear();
      in_word = false;
    } else {
      cur += c;
      in_word = true;
    }
  }
  if (quote != 0) throw std::runtime_error("table line " + std::to_string(line) + ": unclosed quote");
  if (in_word) out.push_back(cur);
  return out;
}

std::vector<Row> read_table(const fs::path& path, const std::string& fixtures, const std::string& scratch) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::vector<Row> rows;
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    if (trim(text).empty() || trim(text)[0] == '#') continue;
    if (text.size() >= 2 && text.compare(text.size() - 2, 2, " |") == 0) text += " ";  // no arguments
    const auto a = text.find(" | "), b = a == std::string::npos ? a : text.find(" | ", a + 3);
    if (b == std::string::npos) throw std::runtime_error("table line " + std::to_string(number) + ": not EXIT | FRAGMENT | ARGS");
    Row r;
    r.line = number;
    const std::string status = trim(text.substr(0, a));
    r.exit = std::stoi(status);
    if (const auto at = status.find('@'); at != std::string::npos) r.rss_limit_kib = std::stol(status.substr(at + 1)) * 1024;
    r.fragment = trim(text.substr(a + 3, b - a - 3));
    for (std::string w : words(text.substr(b + 3), number)) {
      r.args.push_back(replace_all(replace_all(w, "@F/", fixtures + "/"), "@T/", scratch + "/"));
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

void write_file(const fs::path& p, const std::string& content) {
  std::ofstream out(p, std::ios::binary);
  out << content;
}

// An mlx-lm prompt cache of kBigLayers KVCache layers of f16 (1, 8, kBigRows, 128) keys
// and values, 512 MiB, written sparse (header and offsets only): the memory-limited rows
// show that inspect and convert never hold the file (docs/large-files.md).
constexpr int kBigLayers = 4;
constexpr long kBigRows = 32768;
void write_big_prompt_cache(const fs::path& path) {
  const long block = 8L * kBigRows * 128 * 2;
  std::string header = "{", meta = R"("__metadata__":{"2.0":"")";
  long at = 0;
  for (int l = 0; l < kBigLayers; ++l) {
    const std::string i = std::to_string(l);
    header += "\"" + i + R"(.2":{"dtype":"I32","shape":[],"data_offsets":[)" + std::to_string(at) + "," +
              std::to_string(at + 4) + "]},";
    at += 4;
    meta += ",\"1." + i + R"(":"KVCache","2.)" + std::to_string(l + 1) + R"(.0":")" + i + R"(.2","2.)" +
            std::to_string(l + 1) + R"(.1":"scalar")";
  }
  const long small = at;
  for (int l = 0; l < kBigLayers; ++l)
    for (const char* field : {".0", ".1"}) {
      header += "\"" + std::to_string(l) + field + R"(":{"dtype":"F16","shape":[1,8,)" + std::to_string(kBigRows) +
                R"(,128],"data_offsets":[)" + std::to_string(at) + "," + std::to_string(at + block) + "]},";
      at += block;
    }
  header += meta + "}}";
  std::string length(8, '\0');
  for (std::size_t i = 0; i < 8; ++i) length[i] = static_cast<char>((header.size() >> (8 * i)) & 0xffu);
  std::string offsets;
  for (int l = 0; l < kBigLayers; ++l) {
    const auto rows = static_cast<std::uint32_t>(kBigRows - l);  // live rows: offset < buffer for all but layer 0
    offsets += std::string(reinterpret_cast<const char*>(&rows), 4);
  }
  write_file(path, length + header + offsets.substr(0, static_cast<std::size_t>(small)));
  fs::resize_file(path, 8 + header.size() + static_cast<std::uintmax_t>(at));
}

// Fixtures made at run time: too large to check in, or binary.
void make_scratch(const fs::path& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir / "a_directory");
  write_file(dir / "empty", "");
  write_file(dir / "comments_only", "# nothing but a comment\n\n   \n");
  write_file(dir / "long_line", "rope " + std::string(2u << 20, 'x') + "\n");
  write_file(dir / "nul_byte", std::string("rope T=4\0 D=64\n", 15));
  write_file(dir / "binary", std::string("\x7f" "ELF\x02\x01\x01\0\0\0\xff\xfe", 12));
  // ~4·10^7 cases from one line (a run that once exhausted memory: docs/ci.md §Test costs).
  std::string values;
  for (int i = 1; i <= 200; ++i) values += (i > 1 ? "," : "") + std::to_string(i);
  write_file(dir / "huge_product", "kv_roll B=" + values + " H=" + values + " L=" + values + " shift=" + values.substr(0, 9) + "\n");
  // Over the case-file size cap without writing 64 MiB: a sparse file.
  { std::ofstream(dir / "oversized"); }
  fs::resize_file(dir / "oversized", (64u << 20) + 1);
  write_file(dir / "bad_op", "rope T=4\nnot_an_op x=1\n");
  write_file(dir / "unterminated", "rope T=4");
  write_file(dir / "one_rope", "rope T=4\n");
  write_file(dir / "big_tensor", "rope T=4\nrope T=100000000000\n");
  write_file(dir / "crlf", "rope T=4\r\nrope T=5\r\n");
  // Vectors files that are not: a header that is not JSON, a header length past the end.
  write_file(dir / "garbage_vectors", std::string("\x05\0\0\0\0\0\0\0hello", 13));
  write_file(dir / "vectors_past_eof", std::string("\xe8\x03\0\0\0\0\0\0{}", 10));
  // mlx-lm prompt-cache files (save_prompt_cache's layout, cache/mlx_prompt_cache.h): an
  // empty KVCache (keys and values None, offset 0), a class mlx-lm has but kvlab cannot
  // read, and a KVCache whose offset tensor lies past the end of the truncated data.
  const auto prompt_cache = [](const std::string& cls, std::size_t data_bytes) {
    const std::string header =
        R"({"0.0":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"0.1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
        R"("0.2":{"dtype":"I32","shape":[],"data_offsets":[0,4]},"__metadata__":{"1.0":")" + cls +
        R"(","2.0":"","2.1.0":"0.0","2.1.1":"none","2.2.0":"0.1","2.2.1":"none","2.3.0":"0.2","2.3.1":"scalar"}})";
    std::string length(8, '\0');
    for (std::size_t i = 0; i < 8; ++i) length[i] = static_cast<char>((header.size() >> (8 * i)) & 0xffu);
    return length + header + std::string(data_bytes, '\0');
  };
  write_file(dir / "empty_kv.safetensors", prompt_cache("KVCache", 4));
  write_file(dir / "unknown_class.safetensors", prompt_cache("MambaCache", 4));
  write_file(dir / "truncated_cache.safetensors", prompt_cache("KVCache", 2));
  write_big_prompt_cache(dir / "big.safetensors");
  if (::mkfifo((dir / "fifo").c_str(), 0600) != 0) throw std::runtime_error("mkfifo failed");
  fs::permissions(dir, fs::perms::owner_all | fs::perms::group_all | fs::perms::others_all);
}

// The goldens' fixtures (issue 44), all under @T/golden_gates/: a FIFO, golden folders
// made of the checked-in model llama_dense with an empty, a FIFO and a loose scenario
// file, model folders holding a user's weights, stale weights kvlab stamped, and a FIFO,
// and the example plugin (it lacks sdpa) when CTest names it.
void make_golden_scratch(const fs::path& dir, const fs::path& golden) {
  const fs::path g = dir / "golden_gates";
  fs::create_directories(g);
  if (::mkfifo((g / "fifo").c_str(), 0600) != 0) throw std::runtime_error("mkfifo failed in " + g.string());
  const auto golden_dir = [&](const std::string& name) {
    const fs::path m = g / name / "models" / "llama_dense";
    fs::create_directories(m);
    fs::create_directories(g / name / "scenarios");
    for (const char* f : {"config.json", "model.sha256"}) fs::copy_file(golden / "models" / "llama_dense" / f, m / f);
    return g / name / "scenarios" / "llama_dense";
  };
  write_file(golden_dir("empty"), "# no scenario\n");
  write_file(golden_dir("loose"), "plain prompts=13 steps=24 max_dlogit=1e30 max_mean_kld=1e30 min_top1=0\n");
  if (::mkfifo(golden_dir("fifo_golden").c_str(), 0600) != 0) throw std::runtime_error("mkfifo failed in " + g.string());
  for (const char* m : {"user_models", "stale_models", "fifo_models"}) fs::create_directories(g / m / "llama_dense");
  write_file(g / "user_models/llama_dense/model.safetensors", "a user's own weights\n");
  write_file(g / "stale_models/llama_dense/model.safetensors", "stale kvlab weights\n");
  write_file(g / "stale_models/llama_dense/model.kvlab-generated",  // sha256 of the line above
             "2f8ebe333bf8e28eb16a520e01e773c7292c382b9397f75a802bfe7e0a3a8b8b  model.safetensors\n");
  if (::mkfifo((g / "fifo_models/llama_dense/model.safetensors").c_str(), 0600) != 0)
    throw std::runtime_error("mkfifo failed in " + g.string());
  if (const char* plugin = std::getenv("KVLAB_CLI_EXAMPLE_PLUGIN"); plugin != nullptr && *plugin != '\0')
    fs::create_symlink(plugin, g / "example_plugin.so");
}

// A leading NAME=value word sets the child's environment, as in a shell.
bool is_assignment(const std::string& w) {
  const std::size_t eq = w.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  for (std::size_t i = 0; i < eq; ++i) {
    const char c = w[i];
    if (!((c >= 'A' && c <= 'Z') || c == '_' || (i > 0 && c >= '0' && c <= '9'))) return false;
  }
  return true;
}

struct Outcome {
  int exit = -1;
  std::string output;
  double seconds = 0;
  long max_rss_kib = 0;
  bool timed_out = false;
};

Outcome run(const std::string& kvlab, const std::vector<std::string>& args, const fs::path& log) {
  Outcome o;
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv{const_cast<char*>(kvlab.c_str())};
    std::size_t first = 0;
    for (; first < args.size() && is_assignment(args[first]); ++first) {
      const std::size_t eq = args[first].find('=');
      setenv(args[first].substr(0, eq).c_str(), args[first].c_str() + eq + 1, 1);
    }
    for (std::size_t i = first; i < args.size(); ++i) argv.push_back(const_cast<char*>(args[i].c_str()));
    argv.push_back(nullptr);
    execv(kvlab.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  while (true) {
    const pid_t done = wait4(pid, &status, WNOHANG, &usage);
    if (done == pid) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kTimeLimitSeconds) {
      kill(pid, SIGKILL);
      wait4(pid, &status, 0, &usage);
      o.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  o.max_rss_kib = usage.ru_maxrss;
  o.exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(log, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  o.output = ss.str();
  return o;
}

std::string shown(const std::vector<std::string>& args) {
  std::string s;
  for (const std::string& a : args) {
    const std::string w = a.size() > 60 ? a.substr(0, 57) + "..." : a;
    s += (s.empty() ? "" : " ") + (w.find(' ') != std::string::npos ? "'" + w + "'" : w);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: cli_table <kvlab> <table> <fixtures dir> <scratch dir>\n";
    return 2;
  }
  const std::string kvlab = fs::absolute(argv[1]).string(), fixtures = fs::absolute(argv[3]).string();
  const fs::path scratch = fs::absolute(argv[4]);
  std::vector<Row> rows;
  try {
    make_scratch(scratch);
    make_golden_scratch(scratch, fs::path(fixtures) / ".." / ".." / ".." / "golden");
    rows = read_table(argv[2], fixtures, scratch.string());
  } catch (const std::exception& e) {
    std::cerr << "cli_table: " << e.what() << "\n";
    return 2;
  }
  int passed = 0, failed = 0;
  for (const Row& r : rows) {
    const Outcome o = run(kvlab, r.args, scratch / "last_output");
    std::string why;
    if (o.timed_out) {
      why = "ran past " + std::to_string(static_cast<int>(kTimeLimitSeconds)) + " s";
    } else if (o.exit != r.exit) {
      why = "exit " + std::to_string(o.exit) + ", expected " + std::to_string(r.exit);
    } else if (!r.fragment.empty() && o.output.find(r.fragment) == std::string::npos) {
      why = "output lacks \"" + r.fragment + "\"";
    } else if (o.max_rss_kib > r.rss_limit_kib) {
      why = "peak RSS " + std::to_string(o.max_rss_kib / 1024) + " MiB over the limit";
    }
    char head[96];
    std::snprintf(head, sizeof head, "%-4s line %3d  exit %3d  %6.2f s  %5ld MiB  ", why.empty() ? "ok" : "FAIL", r.line,
                  o.exit, o.seconds, o.max_rss_kib / 1024);
    std::cout << head << "kvlab " << shown(r.args) << "\n";
    if (why.empty()) {
      ++passed;
    } else {
      ++failed;
      std::string out = o.output.size() > 2000 ? o.output.substr(0, 2000) + "\n[...]" : o.output;
      std::cout << "     " << why << "; output:\n" << out << "\n";
    }
  }
  std::cout << passed << " passed, " << failed << " failed\n";
  return failed == 0 && passed > 0 ? 0 : 1;
}
