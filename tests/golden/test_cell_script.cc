// The cell cache's command language (golden/files/cell_script.h): every verb parses and
// prints back as written; non-canonical or malformed commands are errors naming the command.
#include <gtest/gtest.h>

#include "golden/files/cell_script.h"
#include "kvlab/error.h"

namespace kvlab::cell_script {
namespace test_cell_script {

TEST(CellScript, EveryVerbRoundTrips) {
  for (const char* s : {"p0:13", "d0", "d0_2_5", "rm1:-", "rm1:4-", "rm1:-7", "rm1:2-9", "cp0_3:0-10", "cp2_1:-",
                        "keep4", "add0:8-:-4", "add1:-:3", "div2:4-12:2", "p0:5.d0.add0:3-:-2.d0.cp0_1:-.p1:2"}) {
    SCOPED_TRACE(s);
    EXPECT_EQ(to_string(parse(s)), s);
  }
  const auto c = parse("add0:8-:-4");
  ASSERT_EQ(c.size(), 1U);
  EXPECT_EQ(c[0].verb, Verb::add);
  EXPECT_EQ(c[0].p0, 8);
  EXPECT_EQ(c[0].p1, -1);
  EXPECT_EQ(c[0].n, -4);
}

TEST(CellScript, NonCanonicalOrMalformedCommandsAreErrorsNamingThem) {
  for (const char* s : {"", "p0", "p0:0", "p00:3", "p0:03", "d1_0", "d1_1", "d8", "rm0:5-5", "rm0:5-3", "rm0",
                        "cp1_1:-", "add0:-:0", "add0:-:+2", "div0:-:1", "div0:-:-2", "keep", "x0", "p0:3.", "p0:3..d0",
                        "d0 ", "p0:99999"}) {
    SCOPED_TRACE(s);
    try {
      parse(s);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::invalid_argument);
    }
  }
  try {
    parse("p0:3.d0_0");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'d0_0'"), std::string::npos) << e.what();
  }
}

}  // namespace test_cell_script
}  // namespace kvlab::cell_script
