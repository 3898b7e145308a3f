// knod-policy metrics' text: escaping of hostile label values, the families an operator reads,
// and the atomic textfile.
#include "cli/metrics_format.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace {

using knod::cli::prom_label_value;
using knod::cli::render_metrics;

TEST(MetricsFormat, LabelValuesAreEscaped) {
    EXPECT_EQ(prom_label_value("plain"), "plain");
    EXPECT_EQ(prom_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    // Invalid UTF-8 and a terminal escape become \xNN text (its backslash escaped in turn).
    EXPECT_EQ(prom_label_value(std::string("x\xff\x1by", 4)), "x\\\\xff\\\\x1by");
}

nlohmann::json sample() {
    return nlohmann::json::parse(R"({
      "version": "0.1.0", "driver": "sim", "policy_digest": "ab12", "rules": 2,
      "permissive": false, "start_time_us": 1700000000500000,
      "requests": {"allow": 3, "deny": 1}, "refusals": {"request-denied": 1},
      "ended": {"release": 2}, "rate_limited": {"RequestBinding": 0},
      "bindings": [{"state": "active", "netdev": "eth0", "gpu": "sim0",
                    "rule": "evil\"}\nknod_up 0\n# x\\", "count": 1}],
      "traffic": [{"netdev": "eth0", "gpu": "sim0", "rx_bytes": 20, "rx_packets": 5,
                   "dropped_packets": 1}],
      "datapath": {"unmatched_passed": 4, "eth0.guard.misrouted": 2,
                   "eth0.rx-queue-3.nic_rx_bytes": 900},
      "journal": {"available": true, "pending_records": 0, "dropped_records": 0,
                  "commit_seconds": {"buckets": [[0.005, 1], [0.01, 2]], "count": 3,
                                     "sum": 0.25}},
      "sinks": [{"name": "journald", "written": 7, "failed": 0, "dropped": 0,
                 "failing": false}]})");
}

TEST(MetricsFormat, HostileRuleNameStaysInItsLabel) {
    std::string text = render_metrics(sample());
    std::istringstream in(text);
    std::string line;
    int up = 0, binding_lines = 0;
    while (std::getline(in, line)) {
        if (line.rfind("knod_up ", 0) == 0) ++up;
        if (line.rfind("knod_bindings{", 0) == 0) ++binding_lines;
    }
    EXPECT_EQ(up, 1) << text; // the rule name did not add a sample of its own
    EXPECT_EQ(binding_lines, 1) << text;
    EXPECT_NE(
        text.find("knod_bindings{state=\"active\",netdev=\"eth0\",gpu=\"sim0\",rule=\"evil\\\""
                  "}\\nknod_up 0\\n# x\\\\\"} 1\n"),
        std::string::npos)
        << text;
}

// knod_job_bindings: one series per job the daemon reported (it bounds them: at most 64 and
// "(other)"), each label value escaped; a daemon without job tags reports none.
TEST(MetricsFormat, JobBindingsOneSeriesPerJobEscaped) {
    auto m = sample();
    m["jobs"] = nlohmann::json::parse(R"js([{"job": "10.0.0.1:29500", "count": 2},
        {"job": "(other)", "count": 7}, {"job": "x\"}\nknod_up 0", "count": 1}])js");
    EXPECT_EQ(render_metrics(m).find("knod_job_bindings"), std::string::npos)
        << "only when asked (--job-tags)";
    std::string text = render_metrics(m, true);
    EXPECT_NE(text.find("# TYPE knod_job_bindings gauge\n"), std::string::npos) << text;
    EXPECT_NE(text.find("knod_job_bindings{job_tag=\"10.0.0.1:29500\"} 2\n"), std::string::npos)
        << text;
    EXPECT_NE(text.find("knod_job_bindings{job_tag=\"(other)\"} 7\n"), std::string::npos) << text;
    EXPECT_NE(text.find("knod_job_bindings{job_tag=\"x\\\"}\\nknod_up 0\"} 1\n"), std::string::npos)
        << text;
    std::istringstream in(text);
    std::string line;
    int up = 0, jobs = 0;
    while (std::getline(in, line)) {
        if (line.rfind("knod_up ", 0) == 0) ++up;
        if (line.rfind("knod_job_bindings{", 0) == 0) ++jobs;
    }
    EXPECT_EQ(up, 1) << text;
    EXPECT_EQ(jobs, 3) << text;
    EXPECT_EQ(render_metrics(sample(), true).find("knod_job_bindings{"), std::string::npos);
}

TEST(MetricsFormat, FamiliesAndUnits) {
    std::string text = render_metrics(sample());
    for (const char *want :
         {"knod_info{version=\"0.1.0\",driver=\"sim\",policy_digest=\"ab12\"} 1\n",
          "knod_start_time_seconds 1700000000.5\n", "knod_requests_total{decision=\"allow\"} 3\n",
          "knod_refusals_total{kind=\"request-denied\"} 1\n",
          "knod_bindings_ended_total{reason=\"release\"} 2\n",
          "knod_rx_bytes_total{netdev=\"eth0\",gpu=\"sim0\"} 20\n",
          "knod_dropped_packets_total{netdev=\"eth0\",gpu=\"sim0\"} 1\n",
          "knod_datapath_packets_total{event=\"unmatched_passed\"} 4\n",
          "knod_guard_packets_total{netdev=\"eth0\",event=\"misrouted\"} 2\n",
          "knod_nic_rx_bytes_total{netdev=\"eth0\",queue=\"3\"} 900\n",
          "# TYPE knod_journal_commit_duration_seconds histogram\n",
          "knod_journal_commit_duration_seconds_bucket{le=\"0.005\"} 1\n",
          "knod_journal_commit_duration_seconds_bucket{le=\"+Inf\"} 3\n",
          "knod_journal_commit_duration_seconds_sum 0.25\n",
          "knod_journal_commit_duration_seconds_count 3\n",
          "knod_sink_written_records_total{sink=\"journald\"} 7\n",
          "knod_sink_failing{sink=\"journald\"} 0\n"})
        EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
    EXPECT_EQ(text.find("# TYPE knod_up gauge\nknod_up 1\n"), text.find("# TYPE knod_up"));
}

TEST(MetricsFormat, DownSaysOnlyThat) {
    EXPECT_EQ(knod::cli::render_down(),
              "# HELP knod_up 1 when knod-policyd answered for these figures, 0 when it could not "
              "be asked.\n# TYPE knod_up gauge\nknod_up 0\n");
}

TEST(MetricsFormat, TextfileIsReplacedWholeAndReadable) {
    auto dir = std::filesystem::temp_directory_path() /
               ("knod-metrics-test-" + std::to_string(::getpid()));
    std::filesystem::create_directory(dir);
    // The file is 0640 and the collector's group whatever the umask: node_exporter is another
    // user, and no other local user reads per-rule figures (issue #51). A group this process is
    // in stands for the collector's.
    ::umask(077);
    gid_t collector = ::getegid();
    ASSERT_TRUE(knod::cli::write_textfile(dir, "k.prom", "a 1\n", collector).ok());
    ASSERT_TRUE(knod::cli::write_textfile(dir, "k.prom", "b 2\n", collector).ok());
    std::ifstream f(dir / "k.prom");
    std::stringstream got;
    got << f.rdbuf();
    EXPECT_EQ(got.str(), "b 2\n");
    struct stat st {};
    ASSERT_EQ(::stat((dir / "k.prom").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0640u);
    EXPECT_EQ(st.st_gid, collector);
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1); // no temp left
    std::filesystem::remove_all(dir);
    auto missing = knod::cli::write_textfile(dir, "k.prom", "x\n", collector);
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.error().message.find(dir.string()), std::string::npos)
        << missing.error().message;
}

} // namespace
